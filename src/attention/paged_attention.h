// paged_attention: causal attention of new queries over a sequence's paged, encoded KV cache.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/thread_pool.h"
#include "kv/kv_storage.h"

namespace kvlm {

// One sequence, one layer. The kernel sees integer tables only, never cache objects.
struct PagedAttentionArgs {
  const KvStorage* storage = nullptr;
  int layer = 0;
  const int32_t* block_table = nullptr;  // [num_table_blocks] block ids of the sequence in token order
  int num_table_blocks = 0;
  int num_context_tokens = 0;  // tokens in the cache visible to the LAST query (its own K/V included)
  // The queries are the last num_queries tokens of the context: query i sees cache
  // tokens [0, num_context_tokens - num_queries + i] (causal). 1 = decode, more = prefill.
  int num_queries = 0;
  int num_heads = 0;          // query heads; a multiple of num_kv_heads (MHA, GQA, MQA)
  const float* q = nullptr;   // [num_queries, num_heads, head_dim]
  // value_dim = the layout's value_dim(): head_dim, or a latent layout's value prefix (MLA).
  float* out = nullptr;       // [num_queries, num_heads, value_dim]; must not alias q
  float scale = 0.0f;         // usually 1/sqrt(head_dim)

  // Attention sinks and a sliding window (token eviction, StreamingLLM). Every query sees
  // tokens [0, num_sink_tokens) and [window_begin, its own position]; tokens
  // [num_sink_tokens, window_begin) are evicted slots it skips. The sinks are scored with
  // q_sink when given (the query rotated at its position within the cache, while q is rotated
  // at its position in the text: see docs/ARCHITECTURE.md, "Positions under eviction"), else
  // with q. window_begin <= num_sink_tokens hides nothing; window_begin must not pass the
  // first query.
  int num_sink_tokens = 0;
  int window_begin = 0;
  const float* q_sink = nullptr;  // [num_queries, num_heads, head_dim] or nullptr

  // Sliding-window attention (gemma3's local layers): query i, at cache token
  // p = num_context_tokens - num_queries + i, sees only tokens (p - sliding_window, p]. 0 = none.
  // Table entries of blocks wholly before the first query's window are never read (they may be
  // -1: the cache released them). Not combined with sinks, window_begin or token weights.
  int sliding_window = 0;
  // The general form (local layers under token eviction, where slots are not positions): query
  // i sees only tokens from query_first_token[i] on, besides what the rest of these arguments
  // allow. Non-decreasing, each at most its query's own token. Table entries of blocks no query
  // reads (wholly before the first query's first token, sink blocks included; wholly inside the
  // evicted range [num_sink_tokens, window_begin)) may be -1. Not combined with sliding_window.
  const int32_t* query_first_token = nullptr;  // [num_queries] or nullptr

  // When set, the softmax weight that each query of [first_weight_query, num_queries) gives each
  // token, summed over those queries and all heads, is added to token_weights[token] (H2O,
  // SnapKV). The kernels emit the scores as they compute them; only asking costs anything.
  float* token_weights = nullptr;  // [num_context_tokens]
  int first_weight_query = 0;
};

// Which kernel family runs. kAuto takes the best the CPU supports (cpu_features())
// for this head_dim and value_dim; the others force one family, for tests and benchmarks,
// and fall back to kPortable when the CPU or the sizes do not allow it.
enum class AttentionIsa {
  kAuto,
  kPortable,  // any head_dim
  kAvx2,      // head_dim % 8 == 0 and value_dim % 8 == 0
  kAvx512,    // head_dim % 16 == 0 and value_dim % 16 == 0
};

// Query head h reads kv head h / (num_heads / num_kv_heads). K and V are read
// straight from their blocks in the storage's encoding (decoded in registers),
// each row once per group of query heads (once per 8 heads of larger groups)
// and query: up to 8 (query, head) rows share every decoded K/V vector.
// Softmax is online, in f32.
// A latent layout (MLA, KvLayout::is_latent) is MQA over its rows: every query head scores the
// row as its key and accumulates the row's first value_dim values as its value, read from the
// same bytes (the storage has no V). When the storage keeps the rows rotated, the output comes
// back rotated (H is block diagonal and its blocks tile value_dim, see KvStorage) and is
// rotated back here, so out is always in the model's space.
// Work is split across (kv head, query tile) and, when that gives too few
// tasks, across chunks of the context (flash-decoding), merged at the end. The
// split depends on the shapes only, never on the thread count, so results are
// bitwise the same for any number of threads.
// Arguments are checked (KVLM_CHECK): they come from the model, not the user.
// Uses `pool` for its own tasks, so it must not be called from inside a task of
// the same pool (ThreadPool::run is not reentrant).
void paged_attention(const PagedAttentionArgs& args, ThreadPool& pool, AttentionIsa isa = AttentionIsa::kAuto);

// The kernel family kAuto or `isa` resolves to for these sizes on this CPU.
AttentionIsa resolve_attention_isa(AttentionIsa isa, int head_dim, int value_dim);
// The same with value_dim = head_dim (separate K and V rows).
inline AttentionIsa resolve_attention_isa(AttentionIsa isa, int head_dim) {
  return resolve_attention_isa(isa, head_dim, head_dim);
}
// For a storage's layout (its head_dim and value_dim).
inline AttentionIsa resolve_attention_isa(AttentionIsa isa, const KvLayout& layout) {
  return resolve_attention_isa(isa, layout.head_dim, layout.value_dim());
}
const char* attention_isa_name(AttentionIsa isa);

namespace attention_internal {
// The most attention-score floats one call keeps for weights (64 MiB); past it, the queries run
// in slices. Tests pass a smaller limit to exercise the slicing.
constexpr size_t kMaxScoreFloats = size_t{16} << 20;
void paged_attention_with_score_limit(const PagedAttentionArgs& args, ThreadPool& pool, AttentionIsa isa,
                                      size_t max_score_floats);
}  // namespace attention_internal

}  // namespace kvlm
