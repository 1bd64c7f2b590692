// reference_attention: plain causal attention over contiguous K/V in double; the oracle for the paged kernels.
#pragma once

#include <cstdint>
#include <vector>

namespace kvlm {

// Same semantics as PagedAttentionArgs, without pages or codecs: query i (the
// last num_queries context tokens) sits at position p = num_context_tokens - num_queries + i
// and sees token t when t <= p and (t < num_sink_tokens or t >= window_begin); query
// head h reads kv head h / (num_heads / num_kv_heads). A sink token (t < num_sink_tokens)
// is scored with q_sink when given, else with q. The defaults (no sinks, window_begin 0)
// are plain causal attention.
// Values of another width than the keys (value_dim), and MLA's latent form: with v == nullptr a
// token's value is the first value_dim values of its key row (KvLayout::is_latent).
struct ReferenceAttentionArgs {
  const float* q = nullptr;  // [num_queries, num_heads, head_dim]
  const float* k = nullptr;  // [num_context_tokens, num_kv_heads, head_dim]
  const float* v = nullptr;  // [num_context_tokens, num_kv_heads, value_dim], or nullptr: k's prefixes
  int num_context_tokens = 0;
  int num_queries = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int value_dim = 0;  // 0: head_dim; at most head_dim when v is nullptr
  float scale = 0.0f;

  // Attention sinks and a sliding window (see PagedAttentionArgs). Tokens that no query
  // sees are never read, so they may hold anything (NaN included).
  int num_sink_tokens = 0;
  int window_begin = 0;
  const float* q_sink = nullptr;  // [num_queries, num_heads, head_dim] or nullptr
  // Sliding-window attention: query at p also needs p - t < sliding_window (0 = no limit).
  int sliding_window = 0;
  // The general form: query i also needs t >= query_first_token[i] (nullptr = no limit).
  const int32_t* query_first_token = nullptr;  // [num_queries]

  // Score with the integer queries the kernels use over int8 and int4 keys
  // (query_rounding.h): each scaled (query, head) row rounded to integers × one step.
  bool round_queries = false;

  // When given, receives the softmax weights, zero for tokens a query does not see:
  // resized to [num_queries, num_heads, num_context_tokens]. Each (query, head) row sums to 1.
  std::vector<double>* weights = nullptr;
};

// Two passes per row (max, then exp-sum and weighted sum), all in double.
// Returns [num_queries, num_heads, value_dim].
std::vector<float> reference_attention(const ReferenceAttentionArgs& args);

}  // namespace kvlm
