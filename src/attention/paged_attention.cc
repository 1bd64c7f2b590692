#include "attention/paged_attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/attention_kernel.h"
#include "attention/rotated_queries.h"
#include "core/check.h"
#include "core/cpu_features.h"
#include "kv/hadamard.h"

namespace kvlm {
namespace {

using attention_internal::AttentionKernelFn;
using attention_internal::AttentionTask;
using attention_internal::AttentionWork;

// (query, head) rows one task processes: enough to reuse each K/V tile many
// times from L1 during prefill, few enough to leave many tasks.
constexpr int kTargetRowsPerTask = 32;
// Below this many (kv head, query tile) tasks, the context is split into chunks
// (flash-decoding) so that all threads have work during decode.
constexpr int kMinTasks = 16;
// A chunk shorter than this costs more to merge than it gains.
constexpr int kMinChunkTokens = 256;
// Chunk starts are aligned to the kernels' token tile.
constexpr int kChunkAlign = 32;

int ceil_div(int a, int b) { return (a + b - 1) / b; }

void check_args(const PagedAttentionArgs& a) {
  KVLM_CHECK(a.storage != nullptr, "paged_attention: no storage");
  const KvLayout& layout = a.storage->layout();
  KVLM_CHECK(a.layer >= 0 && a.layer < layout.num_layers, "paged_attention: layer {} out of range [0, {})", a.layer,
             layout.num_layers);
  KVLM_CHECK(a.num_queries >= 1, "paged_attention: num_queries {} < 1", a.num_queries);
  KVLM_CHECK(a.num_context_tokens >= a.num_queries,
             "paged_attention: {} context tokens cannot include {} queries (queries are the last context tokens)",
             a.num_context_tokens, a.num_queries);
  KVLM_CHECK(a.num_heads >= 1 && a.num_heads % layout.num_kv_heads == 0,
             "paged_attention: num_heads {} is not a multiple of num_kv_heads {}", a.num_heads, layout.num_kv_heads);
  KVLM_CHECK(a.q != nullptr && a.out != nullptr, "paged_attention: null q or out");
  KVLM_CHECK(a.first_weight_query >= 0 && a.first_weight_query < a.num_queries,
             "paged_attention: first weight query {} outside [0, {})", a.first_weight_query, a.num_queries);
  const int needed_blocks = ceil_div(a.num_context_tokens, layout.block_size);
  KVLM_CHECK(a.block_table != nullptr && a.num_table_blocks >= needed_blocks,
             "paged_attention: {} context tokens need {} blocks of {}, the table has {}", a.num_context_tokens,
             needed_blocks, layout.block_size, a.num_table_blocks);
  KVLM_CHECK(a.num_sink_tokens >= 0 && a.window_begin >= 0 &&
                 std::max(a.num_sink_tokens, a.window_begin) <= a.num_context_tokens - a.num_queries,
             "paged_attention: sinks [0, {}) and window from {} must lie before the first query at {}",
             a.num_sink_tokens, a.window_begin, a.num_context_tokens - a.num_queries);
  KVLM_CHECK(a.sliding_window >= 0, "paged_attention: sliding window {} < 0", a.sliding_window);
  KVLM_CHECK(a.sliding_window == 0 || (a.num_sink_tokens == 0 && a.window_begin == 0 && a.q_sink == nullptr &&
                                       a.token_weights == nullptr && a.query_first_token == nullptr),
             "paged_attention: a sliding window does not combine with sinks, window_begin, token weights or "
             "query_first_token");
  const int first_query_pos = a.num_context_tokens - a.num_queries;
  if (a.query_first_token != nullptr) {
    for (int i = 0; i < a.num_queries; ++i) {
      const int f = a.query_first_token[i];
      KVLM_CHECK(f >= 0 && f <= first_query_pos + i && (i == 0 || f >= a.query_first_token[i - 1]),
                 "paged_attention: query {} first token {} must lie in [previous query's, {}]", i, f,
                 first_query_pos + i);
    }
  }
  // Blocks no query reads may be -1: before the first query's first token (sinks aside), and
  // wholly inside the evicted range [num_sink_tokens, window_begin).
  int first_read_token =
      a.sliding_window > 0 ? std::max(0, first_query_pos - a.sliding_window + 1) : 0;
  if (a.query_first_token != nullptr) {
    const int f0 = a.query_first_token[0];
    first_read_token = f0 < a.num_sink_tokens ? f0 : std::max(f0, a.window_begin);
  }
  const int bs = layout.block_size;
  for (int i = first_read_token / bs; i < needed_blocks; ++i) {
    if (i * bs >= a.num_sink_tokens && (i + 1) * bs <= a.window_begin) continue;  // evicted, unread
    KVLM_CHECK(a.block_table[i] >= 0 && a.block_table[i] < a.storage->num_blocks(a.layer),
               "paged_attention: block_table[{}] = {} outside the storage's {} blocks", i, a.block_table[i],
               a.storage->num_blocks(a.layer));
  }
}

AttentionKernelFn select_kernel(AttentionIsa isa, const KvStorage& storage) {
  const KvType k_type = storage.k_type();
  const KvType v_type = storage.v_type();
  if (storage.layout().is_latent()) {  // one row type (KvStorage makes v_type equal it)
    switch (isa) {
      case AttentionIsa::kAvx512:
        return attention_internal::latent_attention_kernel_avx512(k_type);
      case AttentionIsa::kAvx2:
        return attention_internal::latent_attention_kernel_avx2(k_type);
      case AttentionIsa::kPortable:
      case AttentionIsa::kAuto:
        break;
    }
    return attention_internal::latent_attention_kernel_portable(k_type);
  }
  switch (isa) {
    case AttentionIsa::kAvx512:
      return attention_internal::attention_kernel_avx512(k_type, v_type);
    case AttentionIsa::kAvx2:
      return attention_internal::attention_kernel_avx2(k_type, v_type);
    case AttentionIsa::kPortable:
    case AttentionIsa::kAuto:
      break;
  }
  return attention_internal::attention_kernel_portable(k_type, v_type);
}

// Combines the chunks' partial states of rows [begin, end) into normalized outputs:
// out = sum_c exp(m_c - M) acc_c / sum_c exp(m_c - M) l_c, with M the largest m_c.
void merge_chunks(int num_chunks, size_t num_rows, int value_dim, const float* partial_max, const float* partial_sum,
                  const float* partial_acc, size_t begin, size_t end, float* out) {
  const size_t D = static_cast<size_t>(value_dim);
  for (size_t row = begin; row < end; ++row) {
    float max_all = -std::numeric_limits<float>::infinity();
    for (int c = 0; c < num_chunks; ++c) {
      const size_t i = static_cast<size_t>(c) * num_rows + row;
      if (partial_sum[i] > 0.0f) max_all = std::max(max_all, partial_max[i]);
    }
    float* o = out + row * D;
    std::fill(o, o + D, 0.0f);
    float sum = 0.0f;
    for (int c = 0; c < num_chunks; ++c) {
      const size_t i = static_cast<size_t>(c) * num_rows + row;
      if (partial_sum[i] <= 0.0f) continue;  // the row saw no token of this chunk
      const float w = std::exp(partial_max[i] - max_all);
      sum += w * partial_sum[i];
      const float* a = partial_acc + i * D;
      for (size_t d = 0; d < D; ++d) o[d] += w * a[d];
    }
    const float inv = 1.0f / sum;
    for (size_t d = 0; d < D; ++d) o[d] *= inv;
  }
}

// token_weights[t] += sum over rows of the weighted queries of exp(score - M) / L, with M and L
// the row's softmax max and sum over all chunks. Split over tokens, each summing the rows in
// order, so the result does not depend on the thread count.
void add_token_weights(const PagedAttentionArgs& args, int num_chunks, size_t num_rows, const float* partial_max,
                       const float* partial_sum, const float* scores, ThreadPool& pool) {
  const size_t first_row = static_cast<size_t>(args.first_weight_query) * static_cast<size_t>(args.num_heads);
  std::vector<float> row_max(num_rows), row_inv_sum(num_rows);
  for (size_t row = first_row; row < num_rows; ++row) {
    float m = -std::numeric_limits<float>::infinity();
    for (int c = 0; c < num_chunks; ++c) {
      const size_t i = static_cast<size_t>(c) * num_rows + row;
      if (partial_sum[i] > 0.0f) m = std::max(m, partial_max[i]);
    }
    double l = 0.0;
    for (int c = 0; c < num_chunks; ++c) {
      const size_t i = static_cast<size_t>(c) * num_rows + row;
      if (partial_sum[i] > 0.0f) l += std::exp(static_cast<double>(partial_max[i]) - m) * partial_sum[i];
    }
    row_max[row] = m;
    row_inv_sum[row] = static_cast<float>(1.0 / l);
  }
  const size_t ctx = static_cast<size_t>(args.num_context_tokens);
  pool.parallel_for(static_cast<int64_t>(ctx), 512, [&](int64_t begin, int64_t end) {
    for (size_t row = first_row; row < num_rows; ++row) {
      const float* s = scores + (row - first_row) * ctx;  // rows exist from first_row on
      for (int64_t t = begin; t < end; ++t) {
        if (s[t] == -std::numeric_limits<float>::infinity()) continue;
        args.token_weights[t] += std::exp(s[t] - row_max[row]) * row_inv_sum[row];
      }
    }
  });
}

}  // namespace

namespace attention_internal {
namespace {
std::atomic<uint64_t> g_family_runs[3];
}  // namespace
uint64_t kernel_family_runs(KernelFamily family) {
  return g_family_runs[static_cast<int>(family)].load(std::memory_order_relaxed);
}
void count_kernel_family_run(KernelFamily family) {
  g_family_runs[static_cast<int>(family)].fetch_add(1, std::memory_order_relaxed);
}
}  // namespace attention_internal

const char* attention_isa_name(AttentionIsa isa) {
  switch (isa) {
    case AttentionIsa::kAuto:
      return "auto";
    case AttentionIsa::kPortable:
      return "portable";
    case AttentionIsa::kAvx2:
      return "avx2";
    case AttentionIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

AttentionIsa resolve_attention_isa(AttentionIsa isa, int head_dim, int value_dim) {
  const CpuFeatures& cpu = cpu_features();
  const bool avx2 = cpu.avx2 && cpu.fma && cpu.f16c && head_dim % 8 == 0 && value_dim % 8 == 0;
  // The avx512 file is compiled with f, bw, vl, dq and vnni (integer q·k), so all must be present.
  const bool avx512 = avx2 && cpu.avx512f && cpu.avx512bw && cpu.avx512vl && cpu.avx512dq && cpu.avx512vnni &&
                      head_dim % 16 == 0 && value_dim % 16 == 0;
  switch (isa) {
    case AttentionIsa::kAuto:
      return avx512 ? AttentionIsa::kAvx512 : avx2 ? AttentionIsa::kAvx2 : AttentionIsa::kPortable;
    case AttentionIsa::kAvx512:
      return avx512 ? AttentionIsa::kAvx512 : AttentionIsa::kPortable;
    case AttentionIsa::kAvx2:
      return avx2 ? AttentionIsa::kAvx2 : AttentionIsa::kPortable;
    case AttentionIsa::kPortable:
      break;
  }
  return AttentionIsa::kPortable;
}

namespace {

// Queries [begin, end) of `a` as a call of their own: they are the last tokens of a context
// that ends at the last of them (causal), so nothing else changes.
PagedAttentionArgs query_slice(const PagedAttentionArgs& a, int begin, int end) {
  const KvLayout& layout = a.storage->layout();
  const size_t row = static_cast<size_t>(a.num_heads) * static_cast<size_t>(layout.head_dim);
  const size_t out_row = static_cast<size_t>(a.num_heads) * static_cast<size_t>(layout.value_dim());
  PagedAttentionArgs s = a;
  s.num_context_tokens = a.num_context_tokens - (a.num_queries - end);
  s.num_queries = end - begin;
  s.q = a.q + static_cast<size_t>(begin) * row;
  s.out = a.out + static_cast<size_t>(begin) * out_row;
  s.q_sink = a.q_sink != nullptr ? a.q_sink + static_cast<size_t>(begin) * row : nullptr;
  s.query_first_token = a.query_first_token != nullptr ? a.query_first_token + begin : nullptr;
  s.first_weight_query = std::max(0, a.first_weight_query - begin);
  return s;
}

void run_attention(const PagedAttentionArgs& args, ThreadPool& pool, AttentionIsa isa);

// A latent storage that keeps its rows rotated leaves the outputs (weighted sums of rotated
// value prefixes) rotated by the same blocks, which tile value_dim (KvStorage checks it).
void rotate_latent_outputs_back(const PagedAttentionArgs& args) {
  const KvLayout& layout = args.storage->layout();
  if (!layout.is_latent() || !args.storage->keys_rotated()) return;
  const int block = hadamard_block(layout.head_dim);
  const int blocks_per_row = args.num_heads * (layout.value_dim() / block);
  hadamard_rotate_heads(args.out, args.num_queries * blocks_per_row, block);  // H is its own inverse
}

}  // namespace

void paged_attention(const PagedAttentionArgs& given, ThreadPool& pool, AttentionIsa isa) {
  attention_internal::paged_attention_with_score_limit(given, pool, isa, attention_internal::kMaxScoreFloats);
}

namespace attention_internal {

void paged_attention_with_score_limit(const PagedAttentionArgs& given, ThreadPool& pool, AttentionIsa isa,
                                      size_t max_score_floats) {
  check_args(given);
  // Keys stored rotated are scored with queries rotated alike (rotated_queries.h).
  thread_local std::vector<float> rotated_q, rotated_q_sink;
  PagedAttentionArgs args = given;
  args.q = queries_for_storage(*given.storage, given.q, given.num_queries, given.num_heads, rotated_q);
  args.q_sink = queries_for_storage(*given.storage, given.q_sink, given.num_queries, given.num_heads, rotated_q_sink);
  // Weights keep a score per (weighted query, head, token) until the rows' softmax sums are
  // known; a long H2O prompt step would hold queries × heads × context floats. Past the limit
  // the step runs as slices of queries, each with its own score buffer (the sums add up).
  const size_t floats_per_query = static_cast<size_t>(args.num_heads) * static_cast<size_t>(args.num_context_tokens);
  const int weighted = args.num_queries - args.first_weight_query;
  if (args.token_weights != nullptr && static_cast<size_t>(weighted) * floats_per_query > max_score_floats) {
    const int per_slice = static_cast<int>(std::max<size_t>(1, max_score_floats / floats_per_query));
    if (args.first_weight_query > 0) {
      PagedAttentionArgs head = query_slice(args, 0, args.first_weight_query);
      head.token_weights = nullptr;
      head.first_weight_query = 0;
      run_attention(head, pool, isa);
    }
    for (int begin = args.first_weight_query; begin < args.num_queries; begin += per_slice) {
      run_attention(query_slice(args, begin, std::min(args.num_queries, begin + per_slice)), pool, isa);
    }
  } else {
    run_attention(args, pool, isa);
  }
  rotate_latent_outputs_back(args);
}

}  // namespace attention_internal

namespace {

// Numbers the calls of run_attention: a task's prepared queries are only reused within one.
std::atomic<uint64_t> g_calls{0};

// The rows a task prepared its queries for, in which call, from which queries, in which scratch.
struct PreparedRows {
  uint64_t call_id = 0;  // 0: none yet
  const float* q = nullptr;
  const float* scratch = nullptr;
  int kv_head = 0;
  int query_begin = 0;
  int query_end = 0;
  bool operator==(const PreparedRows&) const = default;
};

void run_attention(const PagedAttentionArgs& args, ThreadPool& pool, AttentionIsa isa) {
  const KvStorage& storage = *args.storage;
  const KvLayout& layout = storage.layout();
  const int value_dim = layout.value_dim();

  AttentionWork work;
  work.layout = layout;
  work.value_dim = value_dim;
  work.k_arena = storage.k_arena(args.layer);
  work.v_arena = storage.v_arena(args.layer);  // a latent layout's: its K arena (its kernels do not read it)
  work.k_block_bytes = storage.k_block_bytes();
  work.v_block_bytes = layout.is_latent() ? storage.k_block_bytes() : storage.v_block_bytes();
  work.k_staged = storage.k_staged_table(args.layer);
  work.v_staged = storage.v_staged_table(args.layer);
  work.block_table = args.block_table;
  work.num_context_tokens = args.num_context_tokens;
  work.num_queries = args.num_queries;
  work.num_heads = args.num_heads;
  work.group_size = args.num_heads / layout.num_kv_heads;
  work.q = args.q;
  work.scale = args.scale;
  // A sliding window is each query's first token, p - W + 1.
  const int first_query_pos = args.num_context_tokens - args.num_queries;
  const int W = args.sliding_window;
  thread_local std::vector<int32_t> window_firsts;
  if (W > 0) {
    window_firsts.resize(static_cast<size_t>(args.num_queries));
    for (int i = 0; i < args.num_queries; ++i) window_firsts[static_cast<size_t>(i)] = std::max(0, first_query_pos + i - W + 1);
    work.query_first_token = window_firsts.data();
  } else {
    work.query_first_token = args.query_first_token;
  }
  const int32_t* firsts = work.query_first_token;
  const AttentionKernelFn kernel = select_kernel(resolve_attention_isa(isa, layout), storage);
  KVLM_CHECK(kernel != nullptr, "no attention kernel for K {} / V {}", kv_type_name(storage.k_type()),
             kv_type_name(storage.v_type()));

  // Sinks and window: the sinks [0, S) are one chunk of their own, scored with q_sink; the
  // window [window_begin, ...) is split like a whole context; evicted slots between them are
  // never visited. Without either, the context starts at 0 and has no sink chunk.
  AttentionWork sink_work = work;
  if (args.q_sink != nullptr) sink_work.q = args.q_sink;
  const int num_sinks = std::min(args.num_sink_tokens, args.num_context_tokens);
  // Sinks wholly before every query's first token are not visited at all.
  const bool sinks_seen = num_sinks > 0 && (firsts == nullptr || firsts[0] < num_sinks);
  const bool split_sinks = sinks_seen && (args.window_begin > num_sinks || args.q_sink != nullptr);
  // Without a sink chunk, either there are no sinks (the window alone may start late) or
  // the window starts at or before their end (nothing is hidden).
  int window_begin = split_sinks ? std::max(args.window_begin, num_sinks) : (sinks_seen ? 0 : args.window_begin);
  if (firsts != nullptr) window_begin = std::max(window_begin, firsts[0]);  // what the first query sees
  const int sink_chunks = split_sinks ? 1 : 0;

  // The split depends on shapes only, so every thread count computes the same sums.
  const int G = work.group_size;
  const int query_tile = std::max(1, kTargetRowsPerTask / G);
  const int num_query_tiles = ceil_div(args.num_queries, query_tile);
  const int base_tasks = layout.num_kv_heads * num_query_tiles;
  int window_chunks = 1;
  if (base_tasks < kMinTasks) {
    window_chunks = std::min(ceil_div(kMinTasks, base_tasks),
                             ceil_div(args.num_context_tokens - window_begin, kMinChunkTokens));
    window_chunks = std::max(1, window_chunks);
  }
  const int num_chunks = sink_chunks + window_chunks;
  // Weights need each row's final softmax max and sum: every task then leaves its partial state.
  const bool partial = num_chunks > 1 || args.token_weights != nullptr;
  const int rows_per_task = query_tile * G;
  const size_t scratch_floats = attention_internal::task_scratch_floats(rows_per_task, layout.head_dim);

  // Partial states of all chunks: [num_chunks, num_queries, num_heads] (+ value_dim for acc).
  const size_t num_rows = static_cast<size_t>(args.num_queries) * static_cast<size_t>(args.num_heads);
  thread_local std::vector<float> partials;
  float* partial_max = nullptr;
  float* partial_sum = nullptr;
  float* partial_acc = nullptr;
  if (partial) {
    const size_t chunk_rows = static_cast<size_t>(num_chunks) * num_rows;
    partials.resize(chunk_rows * (2 + static_cast<size_t>(value_dim)));
    partial_max = partials.data();
    partial_sum = partial_max + chunk_rows;
    partial_acc = partial_sum + chunk_rows;
  }

  // Scores of every (row, token) a row sees, when weights are wanted; -inf elsewhere.
  // Only the weighted queries' rows: a SnapKV prompt step needs its observation window's
  // window × heads × context floats, not the whole prompt's.
  thread_local std::vector<float> scores;
  if (args.token_weights != nullptr) {
    const size_t score_rows =
        static_cast<size_t>(args.num_queries - args.first_weight_query) * static_cast<size_t>(args.num_heads);
    scores.assign(score_rows * static_cast<size_t>(args.num_context_tokens), -std::numeric_limits<float>::infinity());
    work.scores = scores.data();
    work.first_score_query = args.first_weight_query;
    sink_work.scores = scores.data();
    sink_work.first_score_query = args.first_weight_query;
  }

  // Task order: kv head, query tile, chunk.
  const uint64_t call_id = g_calls.fetch_add(1, std::memory_order_relaxed) + 1;
  const int64_t num_tasks = static_cast<int64_t>(base_tasks) * num_chunks;
  pool.run(num_tasks, [&](int64_t task_idx) {
    const int chunk = static_cast<int>(task_idx % num_chunks);
    const int tile = static_cast<int>((task_idx / num_chunks) % num_query_tiles);
    const int kv_head = static_cast<int>(task_idx / (static_cast<int64_t>(num_chunks) * num_query_tiles));
    AttentionTask task;
    task.kv_head = kv_head;
    task.query_begin = tile * query_tile;
    task.query_end = std::min(args.num_queries, task.query_begin + query_tile);
    const int visible_end = first_query_pos + task.query_end;  // tokens the tile's last query sees
    const bool is_sink_chunk = chunk < sink_chunks;
    if (is_sink_chunk) {
      task.token_begin = 0;
      task.token_end = num_sinks;
    } else {
      const int window_chunk = chunk - sink_chunks;
      // Under a sliding window a later query tile starts later: its first query's window.
      const int tile_begin = firsts != nullptr ? std::max(window_begin, firsts[task.query_begin]) : window_begin;
      const int window_len = visible_end - tile_begin;
      const int chunk_len = ceil_div(ceil_div(window_len, window_chunks), kChunkAlign) * kChunkAlign;
      task.token_begin = std::min(visible_end, tile_begin + window_chunk * chunk_len);
      task.token_end = std::min(visible_end, task.token_begin + chunk_len);
    }
    if (!partial) {
      task.out = args.out;
    } else {
      const size_t offset = static_cast<size_t>(chunk) * num_rows;
      task.partial_max = partial_max + offset;
      task.partial_sum = partial_sum + offset;
      task.partial_acc = partial_acc + offset * static_cast<size_t>(value_dim);
    }
    thread_local std::vector<float> scratch;
    if (scratch.size() < scratch_floats) scratch.resize(scratch_floats);
    task.scratch = scratch.data();
    // Chunks of the same rows that follow each other on a thread share their prepared queries.
    const AttentionWork& task_work = is_sink_chunk ? sink_work : work;
    thread_local PreparedRows last;
    const PreparedRows now{call_id, task_work.q, task.scratch, kv_head, task.query_begin, task.query_end};
    task.query_prepared = last == now;
    last = now;
    kernel(task_work, task);
  });

  if (partial) {
    pool.parallel_for(static_cast<int64_t>(num_rows), 8, [&](int64_t begin, int64_t end) {
      merge_chunks(num_chunks, num_rows, value_dim, partial_max, partial_sum, partial_acc,
                   static_cast<size_t>(begin), static_cast<size_t>(end), args.out);
    });
  }
  if (args.token_weights != nullptr) {
    add_token_weights(args, num_chunks, num_rows, partial_max, partial_sum, scores.data(), pool);
    // A buffer past the slicing limit (one query alone over a huge context) is not kept for
    // the life of the thread.
    if (scores.capacity() > attention_internal::kMaxScoreFloats) std::vector<float>().swap(scores);
  }
}

}  // namespace

}  // namespace kvlm
