// reference_attention: plain causal attention over contiguous K/V in double; the oracle for the paged kernels.
#pragma once

#include <vector>

namespace kvlm {

// Same semantics as PagedAttentionArgs, without pages or codecs: query i (the
// last num_queries context tokens) sees tokens [0, num_context_tokens - num_queries + i],
// query head h reads kv head h / (num_heads / num_kv_heads).
struct ReferenceAttentionArgs {
  const float* q = nullptr;  // [num_queries, num_heads, head_dim]
  const float* k = nullptr;  // [num_context_tokens, num_kv_heads, head_dim]
  const float* v = nullptr;  // [num_context_tokens, num_kv_heads, head_dim]
  int num_context_tokens = 0;
  int num_queries = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  float scale = 0.0f;
};

// Two passes per row (max, then exp-sum and weighted sum), all in double.
// Returns [num_queries, num_heads, head_dim].
std::vector<float> reference_attention(const ReferenceAttentionArgs& args);

}  // namespace kvlm
