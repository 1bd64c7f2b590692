#include "attention/attention_weights.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/query_rounding.h"
#include "attention/rotated_queries.h"
#include "core/check.h"

namespace kvlm {
namespace {

// Below this many (kv head, query tile) tasks, queries are split into more tiles so
// that all threads have work; shape-dependent only, so results never depend on threads.
constexpr int kMinTasks = 16;

int ceil_div(int a, int b) { return (a + b - 1) / b; }

void check_args(const PagedAttentionArgs& a, std::span<float> token_weights) {
  KVLM_CHECK(a.storage != nullptr, "accumulate_attention_weights: no storage");
  const KvLayout& layout = a.storage->layout();
  KVLM_CHECK(a.layer >= 0 && a.layer < layout.num_layers, "accumulate_attention_weights: layer {} out of range [0, {})",
             a.layer, layout.num_layers);
  KVLM_CHECK(a.num_queries >= 1, "accumulate_attention_weights: num_queries {} < 1", a.num_queries);
  // Full-context layers only: it reads the table as block ids and knows no per-query first token.
  KVLM_CHECK(a.sliding_window == 0 && a.query_first_token == nullptr && !a.storage->is_local_layer(a.layer),
             "accumulate_attention_weights: sliding-window layers are not supported (layer {})", a.layer);
  KVLM_CHECK(a.num_context_tokens >= a.num_queries,
             "accumulate_attention_weights: {} context tokens cannot include {} queries", a.num_context_tokens,
             a.num_queries);
  KVLM_CHECK(a.num_heads >= 1 && a.num_heads % layout.num_kv_heads == 0,
             "accumulate_attention_weights: num_heads {} is not a multiple of num_kv_heads {}", a.num_heads,
             layout.num_kv_heads);
  KVLM_CHECK(a.q != nullptr, "accumulate_attention_weights: null q");
  const int first_query_pos = a.num_context_tokens - a.num_queries;
  KVLM_CHECK(a.num_sink_tokens >= 0 && a.window_begin >= 0 && std::max(a.num_sink_tokens, a.window_begin) <= first_query_pos,
             "accumulate_attention_weights: sinks [0, {}) and window from {} must lie before the first query at {}",
             a.num_sink_tokens, a.window_begin, first_query_pos);
  KVLM_CHECK(token_weights.size() >= static_cast<size_t>(a.num_context_tokens),
             "accumulate_attention_weights: {} token weights for {} context tokens", token_weights.size(),
             a.num_context_tokens);
  const int needed_blocks = ceil_div(a.num_context_tokens, layout.block_size);
  KVLM_CHECK(a.block_table != nullptr && a.num_table_blocks >= needed_blocks,
             "accumulate_attention_weights: {} context tokens need {} blocks of {}, the table has {}",
             a.num_context_tokens, needed_blocks, layout.block_size, a.num_table_blocks);
  for (int i = 0; i < needed_blocks; ++i) {
    KVLM_CHECK(a.block_table[i] >= 0 && a.block_table[i] < a.storage->num_blocks(),
               "accumulate_attention_weights: block_table[{}] = {} outside the storage's {} blocks", i,
               a.block_table[i], a.storage->num_blocks());
  }
}

// Keys are copied into tiles of kTileTokens tokens laid out [head_dim, kTileTokens], so
// that one query row is scored against a whole tile with plain vector multiply-adds
// across tokens (the compiler vectorizes the fixed-length inner loop, even in this
// portable file, without reassociating sums: each token's dot product is added up in
// order of d).
constexpr int kTileTokens = 16;

// acc[j] = dot(q, key j of the tile), for the tile's kTileTokens keys.
//   q: [head_dim]; tile: [head_dim, kTileTokens]
void score_tile(const float* q, const float* tile, int head_dim, float* acc) {
  static_assert(kTileTokens == 16, "the sums below are written out for 16 tokens");
  // Sixteen named sums, so that they live in (four) vector registers, not in memory.
  float a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
  float a8 = 0, a9 = 0, a10 = 0, a11 = 0, a12 = 0, a13 = 0, a14 = 0, a15 = 0;
  for (int d = 0; d < head_dim; ++d) {
    const float x = q[d];
    const float* k = tile + static_cast<size_t>(d) * kTileTokens;
    a0 += x * k[0], a1 += x * k[1], a2 += x * k[2], a3 += x * k[3];
    a4 += x * k[4], a5 += x * k[5], a6 += x * k[6], a7 += x * k[7];
    a8 += x * k[8], a9 += x * k[9], a10 += x * k[10], a11 += x * k[11];
    a12 += x * k[12], a13 += x * k[13], a14 += x * k[14], a15 += x * k[15];
  }
  acc[0] = a0, acc[1] = a1, acc[2] = a2, acc[3] = a3, acc[4] = a4, acc[5] = a5, acc[6] = a6, acc[7] = a7;
  acc[8] = a8, acc[9] = a9, acc[10] = a10, acc[11] = a11, acc[12] = a12, acc[13] = a13, acc[14] = a14, acc[15] = a15;
}

}  // namespace

void accumulate_attention_weights(const PagedAttentionArgs& given, std::span<float> token_weights, ThreadPool& pool) {
  check_args(given, token_weights);
  // Keys stored rotated are scored with queries rotated alike (rotated_queries.h).
  thread_local std::vector<float> rotated_q, rotated_q_sink;
  PagedAttentionArgs args = given;
  args.q = queries_for_storage(*given.storage, given.q, given.num_queries, given.num_heads, rotated_q);
  args.q_sink = queries_for_storage(*given.storage, given.q_sink, given.num_queries, given.num_heads, rotated_q_sink);
  const KvStorage& storage = *args.storage;
  const KvLayout& layout = storage.layout();
  const int T = args.num_context_tokens;
  const int D = layout.head_dim;
  const size_t width = layout.values_per_token();  // K values of one token: [num_kv_heads, head_dim]
  const int first_query_pos = T - args.num_queries;
  // Tokens some query sees: the sinks [0, sink_end) and the window [window_begin, T).
  const int sink_end = std::min(args.num_sink_tokens, T);
  const int window_begin = std::max(args.window_begin, sink_end);

  // Pass 1: decode the visible keys once, block by block, into tiles.
  const int num_tiles = ceil_div(T, kTileTokens);
  const size_t tile_floats = static_cast<size_t>(D) * kTileTokens;
  const size_t head_floats = static_cast<size_t>(num_tiles) * tile_floats;  // one kv head's keys
  // [num_kv_heads, num_tiles, head_dim, kTileTokens]; evicted tokens' entries unset (never used).
  thread_local std::vector<float> keys;
  keys.resize(static_cast<size_t>(layout.num_kv_heads) * head_floats);
  float* const k_tiles = keys.data();
  const float* const* staged = storage.k_staged_table(args.layer);  // nullptr unless K is a KIVI type
  const KvCodec& codec = storage.k_codec();
  const int B = layout.block_size;
  const int num_blocks = ceil_div(T, B);
  pool.parallel_for(num_blocks, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> decoded;  // [num_kv_heads, head_dim]: one token
    decoded.resize(width);
    for (int64_t b = begin; b < end; ++b) {
      const BlockId block(args.block_table[b]);
      const float* staged_rows = staged != nullptr ? staged[args.block_table[b]] : nullptr;
      const std::byte* encoded = staged_rows == nullptr ? storage.k_block(args.layer, block) : nullptr;
      const int first = static_cast<int>(b) * B;
      const int last = std::min(T, first + B);
      for (int t = first; t < last; ++t) {
        if (t >= sink_end && t < window_begin) continue;  // evicted: never read
        const int slot = t - first;
        const float* row = decoded.data();
        if (staged_rows != nullptr) {
          row = staged_rows + static_cast<size_t>(slot) * width;
        } else {
          codec.decode_token(layout, encoded, slot, decoded.data());
        }
        float* dst = k_tiles + static_cast<size_t>(t / kTileTokens) * tile_floats + t % kTileTokens;
        for (int h = 0; h < layout.num_kv_heads; ++h) {
          const float* src = row + static_cast<size_t>(h) * D;
          float* head_dst = dst + static_cast<size_t>(h) * head_floats;
          for (int d = 0; d < D; ++d) head_dst[static_cast<size_t>(d) * kTileTokens] = src[d];
        }
      }
    }
  });

  // Pass 2: tasks of (kv head, query tile), each adding its rows' weights into its own
  // partial sums, so that no two tasks write the same memory.
  const int G = args.num_heads / layout.num_kv_heads;
  const int num_query_tiles = std::min(args.num_queries, std::max(1, ceil_div(kMinTasks, layout.num_kv_heads)));
  const int query_tile = ceil_div(args.num_queries, num_query_tiles);
  const int num_tasks = layout.num_kv_heads * num_query_tiles;
  thread_local std::vector<double> partials;  // [num_tasks, num_context_tokens]
  partials.assign(static_cast<size_t>(num_tasks) * static_cast<size_t>(T), 0.0);
  double* const partial = partials.data();
  const size_t row_stride = static_cast<size_t>(args.num_heads) * static_cast<size_t>(D);  // one query's q

  const bool round_queries = query_rounding::rounds_queries(args.storage->k_type());
  const float score_scale = round_queries ? 1.0f : args.scale;
  pool.run(num_tasks, [&](int64_t task_idx) {
    const int kv_head = static_cast<int>(task_idx) / num_query_tiles;
    const int tile = static_cast<int>(task_idx) % num_query_tiles;
    const int query_begin = tile * query_tile;
    const int query_end = std::min(args.num_queries, query_begin + query_tile);
    double* const sums = partial + static_cast<size_t>(task_idx) * static_cast<size_t>(T);
    // The group's heads are scored together, tile by tile, so that each key tile is read
    // from memory once per query rather than once per head.
    thread_local std::vector<float> scores;  // [G, num_tiles * kTileTokens]; only visible entries used
    thread_local std::vector<float> max_scores;  // [G]
    const size_t score_stride = static_cast<size_t>(num_tiles) * kTileTokens;
    if (scores.size() < static_cast<size_t>(G) * score_stride) scores.resize(static_cast<size_t>(G) * score_stride);
    max_scores.resize(static_cast<size_t>(G));
    const float* k_head = k_tiles + static_cast<size_t>(kv_head) * head_floats;
    // Over int8 and int4 keys the kernels score with rounded queries: so does this pass.
    thread_local std::vector<float> rounded_q, rounded_q_sink;  // [G, head_dim]
    thread_local std::vector<int16_t> rounded_codes;            // [head_dim]
    auto rounded_rows = [&](const float* rows, std::vector<float>& out) {
      out.resize(static_cast<size_t>(G) * D);
      rounded_codes.resize(static_cast<size_t>(D));
      for (int g = 0; g < G; ++g) {
        query_rounding::rounded_query_values(rows + static_cast<size_t>(g) * D, D, args.scale, rounded_codes.data(),
                                             out.data() + static_cast<size_t>(g) * D);
      }
      return out.data();
    };
    for (int i = query_begin; i < query_end; ++i) {
      const int pos = first_query_pos + i;
      // The query's visible ranges: sinks [0, s_end), window [window_begin, pos].
      const int s_end = std::min(sink_end, pos + 1);
      // The group's query rows, [G, head_dim] contiguous in q (and q_sink).
      const size_t q_off = static_cast<size_t>(i) * row_stride + static_cast<size_t>(kv_head * G) * D;
      const float* q = args.q + q_off;
      const float* q_sink = args.q_sink != nullptr ? args.q_sink + q_off : q;
      if (round_queries) {  // the kernels' integer queries (query_rounding.h), scale included
        q = rounded_rows(q, rounded_q);
        q_sink = args.q_sink != nullptr ? rounded_rows(args.q_sink + q_off, rounded_q_sink) : q;
      }
      std::fill(max_scores.begin(), max_scores.end(), -std::numeric_limits<float>::infinity());
      // Scores tokens [begin, end) with `qs`; whole tiles are computed, only the range kept.
      auto score_range = [&](const float* qs, int begin, int end) {
        float acc[kTileTokens];
        for (int key_tile = begin / kTileTokens; key_tile * kTileTokens < end; ++key_tile) {
          const int first = key_tile * kTileTokens;
          const int j_begin = std::max(begin - first, 0);
          const int j_end = std::min(end - first, kTileTokens);
          for (int g = 0; g < G; ++g) {
            score_tile(qs + static_cast<size_t>(g) * D, k_head + static_cast<size_t>(key_tile) * tile_floats, D, acc);
            float* row = scores.data() + static_cast<size_t>(g) * score_stride + first;
            float& max_score = max_scores[static_cast<size_t>(g)];
            for (int j = j_begin; j < j_end; ++j) {
              row[j] = acc[j] * score_scale;
              max_score = std::max(max_score, row[j]);
            }
          }
        }
      };
      score_range(q_sink, 0, s_end);
      score_range(q, window_begin, pos + 1);
      for (int g = 0; g < G; ++g) {
        float* row = scores.data() + static_cast<size_t>(g) * score_stride;
        const float max_score = max_scores[static_cast<size_t>(g)];
        double sum = 0.0;
        for (int t = 0; t < s_end; ++t) sum += (row[t] = std::exp(row[t] - max_score));
        for (int t = window_begin; t <= pos; ++t) sum += (row[t] = std::exp(row[t] - max_score));
        const double inv = 1.0 / sum;
        for (int t = 0; t < s_end; ++t) sums[t] += row[t] * inv;
        for (int t = window_begin; t <= pos; ++t) sums[t] += row[t] * inv;
      }
    }
  });

  // Pass 3: add the partial sums in task order (the same for any thread count).
  pool.parallel_for(T, 256, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      double total = 0.0;
      for (int task = 0; task < num_tasks; ++task) total += partial[static_cast<size_t>(task) * T + t];
      token_weights[static_cast<size_t>(t)] += static_cast<float>(total);
    }
  });
}

}  // namespace kvlm
