// Internal to attention/: one attention task's description and the per-ISA kernel entry points.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kv/kv_layout.h"
#include "kv/kv_type.h"

namespace kvlm::attention_internal {

// What every task of one paged_attention call shares.
struct AttentionWork {
  KvLayout layout;
  // Values per output row: layout.value_dim() (head_dim, or a latent layout's value prefix).
  int value_dim = 0;
  // A latent layout's kernels read V from the K rows themselves (v_arena is k_arena then).
  const std::byte* k_arena = nullptr;  // [num_blocks, k_block_bytes]
  const std::byte* v_arena = nullptr;  // [num_blocks, v_block_bytes]
  // KIVI only: per block id, its f32 staging rows while staged, else nullptr
  // (KvStorage::k_staged_table); nullptr for other types.
  const float* const* k_staged = nullptr;  // [num_blocks]
  const float* const* v_staged = nullptr;  // [num_blocks]
  size_t k_block_bytes = 0;
  size_t v_block_bytes = 0;
  const int32_t* block_table = nullptr;  // [>= ceil(num_context_tokens / block_size)]
  int num_context_tokens = 0;
  int num_queries = 0;
  int num_heads = 0;
  int group_size = 0;        // query heads per kv head
  const float* q = nullptr;  // [num_queries, num_heads, head_dim]
  float scale = 0.0f;
  // Each query's first visible token (PagedAttentionArgs::sliding_window or query_first_token), or nullptr.
  const int32_t* query_first_token = nullptr;  // [num_queries]
  // When set, every task also writes the scaled score q·k of each token its rows see into
  // row (query * num_heads + head), column token: what attention weights are computed from
  // once the rows' softmax maxima and sums are known (H2O, SnapKV). Tokens no row sees are
  // not written.
  // Only the queries from first_score_query on have rows (SnapKV asks for its observation
  // window alone), so the buffer is [(num_queries - first_score_query) * num_heads, ...].
  float* scores = nullptr;  // [(num_queries - first_score_query) * num_heads, num_context_tokens]
  int first_score_query = 0;
};

// One task: the query heads of one kv head, for queries [query_begin, query_end),
// over cache tokens [token_begin, token_end) (further limited per query by causality and the
// sliding window).
// Its rows are (query, head of the group) in query-major order.
// A task covering the whole visible context writes the normalized result to `out`;
// a task over one chunk writes its unnormalized partial state instead (row max,
// exp-sum, exp-weighted sum of V), which the merge step combines.
struct AttentionTask {
  int kv_head = 0;
  int query_begin = 0;
  int query_end = 0;
  int token_begin = 0;
  int token_end = 0;
  float* out = nullptr;          // [num_queries, num_heads, value_dim], or nullptr when partial
  float* partial_max = nullptr;  // [num_queries, num_heads]  (this chunk's slice)
  float* partial_sum = nullptr;  // [num_queries, num_heads]
  float* partial_acc = nullptr;  // [num_queries, num_heads, value_dim]
  // Caller-owned working memory of task_scratch_floats(rows, head_dim) floats (value_dim <= head_dim),
  // so that the ISA-specific kernels allocate nothing.
  float* scratch = nullptr;
  // True when scratch already holds these rows' prepared queries (pre-scaled, or rounded for
  // integer keys): the previous task on this scratch had the same call, work, kv head and
  // queries, another chunk of the same rows (flash-decoding), so preparing them again is skipped.
  bool query_prepared = false;
};

// Integer query rows are padded to a multiple of this many values (the widest chunk).
inline constexpr int kIntQueryAlign = 64;

inline size_t int_query_stride(int head_dim) {
  return static_cast<size_t>((head_dim + kIntQueryAlign - 1) / kIntQueryAlign * kIntQueryAlign);
}

// Tokens whose scores a kernel holds at once (its tile).
inline constexpr int kTileTokens = 32;

// f32 rows, accumulators, max and sum per row; a tile's key and value metadata as f32
// (at most 2 × head_dim floats per token: KIVI's channel scales and mins per block, the
// values' (scale, min) pairs per token); then, for integer q·k, the rounded query rows
// (int16, padded), their steps and their sums per key group (interleaved with zeros and
// padded to 16), and the int4 lanes' group indices.
inline size_t task_scratch_floats(int num_rows, int head_dim) {
  const size_t rows = static_cast<size_t>(num_rows);
  const size_t d = static_cast<size_t>(head_dim);
  return 2 * rows * d + 2 * rows + 2 * kTileTokens * 2 * d +
         rows * (int_query_stride(head_dim) / 2 + 1 + 2 * d + 16) + int_query_stride(head_dim) / 4;
}

using AttentionKernelFn = void (*)(const AttentionWork& work, const AttentionTask& task);

// A witness of which kernel family ran: every task a kernel runs adds 1 to its family's count
// (0 portable, 1 avx2, 2 avx512), so tests that name a family assert it really ran.
enum class KernelFamily { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };
uint64_t kernel_family_runs(KernelFamily family);
void count_kernel_family_run(KernelFamily family);

// Kernels for one (K type, V type) pair; the SIMD ones need head_dim % 8 (avx2)
// or % 16 (avx512) == 0 and the matching CPU features (avx512 includes VNNI). Every pair of KvTypes has
// a kernel in every family.
AttentionKernelFn attention_kernel_portable(KvType k_type, KvType v_type);
AttentionKernelFn attention_kernel_avx2(KvType k_type, KvType v_type);
AttentionKernelFn attention_kernel_avx512(KvType k_type, KvType v_type);
// Kernels for a latent layout (KvLayout::is_latent) whose rows are `row_type`: the V rows are
// the K rows, read through the same loader, their first value_dim values accumulated. The SIMD
// ones also need value_dim % 8 or % 16 == 0. Every type but KIVI; nullptr for KIVI.
AttentionKernelFn latent_attention_kernel_portable(KvType row_type);
AttentionKernelFn latent_attention_kernel_avx2(KvType row_type);
AttentionKernelFn latent_attention_kernel_avx512(KvType row_type);

}  // namespace kvlm::attention_internal
