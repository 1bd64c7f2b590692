// Internal to attention/: the body of one attention task, templated on SIMD ops and K/V loaders.
#pragma once

// Included by exactly one .cc per instruction set (portable, avx2, avx512), each
// compiled with its own ISA flags. Everything here has internal linkage and calls
// no out-of-line library code, so the linker can never hand a portable caller a
// copy compiled for a wider ISA.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "attention/attention_kernel.h"
#include "attention/attention_loaders.h"
#include "attention/query_rounding.h"
#include "kv/kv_block_format.h"
#include "kv/kv_layout.h"
#include "kv/kv_type.h"

namespace kvlm::attention_internal {
namespace {

// The ops type V provides: Reg, kWidth (dividing head_dim and kTileTokens),
// zero, load, load_reg (a load kept in one register, for values several FMAs use), store,
// set1, fma(a, b, c) = a*b + c, add, mul, max, reduce_add, reduce_max, exp (0 for -inf and
// for arguments below about -87), and the register blocking that fits its register file:
//   qk_tokens<NR>()  tokens whose NR dot products are accumulated at once (1, 2 or 4),
//   reduce_add_n<N>(const Reg* v, float* out)  out[i] = sum of v[i]'s lanes, N as above,
//   pv_chunks<NR>()  head_dim chunks of kWidth whose NR accumulators stay in registers.
// The loaders provide Row, row(block, layout, kv_head, slot), prefetch_slots(block,
// layout, kv_head, slot_begin, slot_end) and load(row, d) -> Reg holding
// elements [d, d + kWidth) of the row as f32.
// kLatent (a latent layout, KvLayout::is_latent): the V rows are the K rows (VL is KL), whose
// first value_dim values are accumulated; nothing about V is loaded or prefetched apart from
// the V side's convert_meta, run on the K rows. Otherwise value_dim is head_dim.
template <class V, class KL, class VL, bool kLatent = false>
struct AttentionKernel {
  using Reg = typename V::Reg;
  using KRow = typename KL::Row;
  using VRow = typename VL::Row;
  static constexpr int W = V::kWidth;
  static_assert(kTileTokens % W == 0);
  static_assert(!kLatent || std::is_same_v<KL, VL>, "latent rows are read through one loader");

  // s[r, t + j] = q[r] · k[t + j] for NR rows and TB tokens: each K chunk is
  // decoded once for all NR rows, and the NR × TB sums are reduced together.
  // DB chunks of each key are decoded at a time (D % (DB × W) == 0).
  template <int NR, int TB, int DB>
  static void qk_step(const float* q /*[NR, D]*/, const KRow* krows, int t, int D, float* s /*[NR, kTileTokens]*/) {
    Reg acc[NR][TB];
    KVLM_ATTENTION_UNROLL
    for (int r = 0; r < NR; ++r) {
      KVLM_ATTENTION_UNROLL
      for (int j = 0; j < TB; ++j) acc[r][j] = V::zero();
    }
    for (int d = 0; d < D; d += DB * W) {
      Reg k[TB][DB];
      KVLM_ATTENTION_UNROLL
      for (int j = 0; j < TB; ++j) load_chunks<KL, DB>(krows[t + j], d, k[j]);
      KVLM_ATTENTION_UNROLL
      for (int r = 0; r < NR; ++r) {
        KVLM_ATTENTION_UNROLL
        for (int c = 0; c < DB; ++c) {
          const Reg qr = V::load_reg(q + r * D + d + c * W);
          KVLM_ATTENTION_UNROLL
          for (int j = 0; j < TB; ++j) acc[r][j] = V::fma(qr, k[j][c], acc[r][j]);
        }
      }
    }
    KVLM_ATTENTION_UNROLL
    for (int r = 0; r < NR; ++r) V::template reduce_add_n<TB>(acc[r], s + r * kTileTokens + t);
  }

  // out[c] = L::load(row, d + c × W) for c < N, through the loader's load_n when it has one.
  template <class L, int N>
  static void load_chunks(const typename L::Row& row, int d, Reg* out) {
    if constexpr (N > 1 && requires { L::template load_n<N>(row, d, out); }) {
      L::template load_n<N>(row, d, out);
    } else {
      KVLM_ATTENTION_UNROLL
      for (int c = 0; c < N; ++c) out[c] = L::load(row, d + c * W);
    }
  }

  // s[r, t] = q[r] · k[t] for NR rows and n tokens. Keys whose loader unpacks several
  // chunks at once (KIVI's packed codes) are decoded two chunks at a time when D allows.
  template <int NR>
  static void qk(const float* q /*[NR, D]*/, const KRow* krows, int n, int D, float* s /*[NR, kTileTokens]*/) {
    constexpr int TB = V::template qk_tokens<NR>();
    int t = 0;
    if constexpr (W > 1 && requires(const KRow& row, Reg* out) { KL::template load_n<2>(row, 0, out); }) {
      if (D % (2 * W) == 0) {
        for (; t + TB <= n; t += TB) qk_step<NR, TB, 2>(q, krows, t, D, s);
        for (; t < n; ++t) qk_step<NR, 1, 2>(q, krows, t, D, s);
        return;
      }
    }
    for (; t + TB <= n; t += TB) qk_step<NR, TB, 1>(q, krows, t, D, s);
    for (; t < n; ++t) qk_step<NR, 1, 1>(q, krows, t, D, s);
  }

  // acc[r, d0 : d0 + DB*W] += sum_t p[r, t] v[t, d0 : d0 + DB*W], the NR × DB
  // accumulators held in registers across all n tokens.
  template <int NR, int DB>
  static void pv_step(const float* p /*[NR, kTileTokens]*/, const VRow* vrows, int n, int D, int d0,
                      float* acc /*[NR, D]*/) {
    Reg o[NR][DB];
    KVLM_ATTENTION_UNROLL
    for (int r = 0; r < NR; ++r) {
      KVLM_ATTENTION_UNROLL
      for (int j = 0; j < DB; ++j) o[r][j] = V::load(acc + r * D + d0 + j * W);
    }
    for (int t = 0; t < n; ++t) {
      Reg pr[NR];
      KVLM_ATTENTION_UNROLL
      for (int r = 0; r < NR; ++r) pr[r] = V::set1(p[r * kTileTokens + t]);
      Reg v[DB];
      load_chunks<VL, DB>(vrows[t], d0, v);
      KVLM_ATTENTION_UNROLL
      for (int j = 0; j < DB; ++j) {
        KVLM_ATTENTION_UNROLL
        for (int r = 0; r < NR; ++r) o[r][j] = V::fma(pr[r], v[j], o[r][j]);
      }
    }
    KVLM_ATTENTION_UNROLL
    for (int r = 0; r < NR; ++r) {
      KVLM_ATTENTION_UNROLL
      for (int j = 0; j < DB; ++j) V::store(acc + r * D + d0 + j * W, o[r][j]);
    }
  }

  // acc[r] += sum_t p[r, t] v[t] for NR rows; each V element is decoded once for all NR rows.
  template <int NR>
  static void pv(const float* p /*[NR, kTileTokens]*/, const VRow* vrows, int n, int D, float* acc /*[NR, D]*/) {
    constexpr int DB = V::template pv_chunks<NR>();
    int d = 0;
    if constexpr (DB >= 8) {
      for (; d + 8 * W <= D; d += 8 * W) pv_step<NR, 8>(p, vrows, n, D, d, acc);
    }
    if constexpr (DB >= 4) {
      for (; d + 4 * W <= D; d += 4 * W) pv_step<NR, 4>(p, vrows, n, D, d, acc);
    }
    if constexpr (DB >= 2) {
      for (; d + 2 * W <= D; d += 2 * W) pv_step<NR, 2>(p, vrows, n, D, d, acc);
    }
    for (; d < D; d += W) pv_step<NR, 1>(p, vrows, n, D, d, acc);
  }

  // Integer q·k (query_rounding.h) for int8 and int4 keys, which are never staged.
  static constexpr bool kIntTokenKeys = std::is_same_v<KL, ScaledLoader<V, KvType::kInt8>>;
  static constexpr bool kIntGroupKeys = std::is_same_v<KL, GroupLoader<V, KvType::kInt4, false>>;
  static constexpr bool kIntKeys = kIntTokenKeys || kIntGroupKeys;

  // A task's rounded query rows.
  struct IntQuery {
    const int16_t* q = nullptr;  // [num_rows, qp]: natural order (int8 keys) or the ISA's int4 chunks
    size_t qp = 0;
    const float* step = nullptr;  // [num_rows]
    // int4 keys: [num_rows, pp] = [0, qsum_0, 0, qsum_1, ..., zeros], qsum_g the sum of the
    // row's integers over group g, laid out like a token's (scale, min) pairs so that one
    // multiply-add of the pairs gives the min term sum_g min_g qsum_g.
    const float* qsum_pairs = nullptr;
    size_t pp = 0;
    int group = 0;     // g (int4 keys)
    bool simd = false;  // whether V's int4 kernel fits this shape (else the scalar form)
    // int4 keys: [qp / 4] where the (scale, min) pair of values [4i, 4i + 4) starts among its
    // segment's pairs (V::kInt4SegmentGroups groups, one register of pairs), 2 × (4i / g mod
    // segment groups); past head_dim, the last group's. The SIMD kernels sum 4 values per
    // lane, so a chunk's lane scales are one permute of the segment's pairs by this.
    const int32_t* lane_pair = nullptr;
  };

  // Rounds the task's query rows (query_rounding.h) into the scratch after the f32 state.
  static IntQuery prepare_int_query(const AttentionWork& w, const AttentionTask& task, int num_rows, float* scratch,
                                    float* natural_scratch /*[num_rows * D] floats, unused otherwise*/) {
    const int D = w.layout.head_dim;
    const int G = w.group_size;
    IntQuery iq;
    iq.qp = int_query_stride(D);
    int16_t* q = reinterpret_cast<int16_t*>(scratch);
    float* step = scratch + static_cast<size_t>(num_rows) * iq.qp / 2;
    float* qsum_pairs = step + num_rows;
    iq.group = kv_format::group_size(D);
    const int num_groups = D / iq.group;
    // Whole registers of pairs: the SIMD kernels read one segment's from any group on.
    iq.pp = static_cast<size_t>((2 * num_groups + 15) / 16 * 16);
    if constexpr (kIntGroupKeys) {
      int32_t* lane_pair = reinterpret_cast<int32_t*>(qsum_pairs + static_cast<size_t>(num_rows) * iq.pp);
      for (size_t i = 0; i < iq.qp / 4; ++i) {
        const int d = static_cast<int>(4 * i) < D ? static_cast<int>(4 * i) : D - 1;
        lane_pair[i] = 2 * ((d / iq.group) % V::kInt4SegmentGroups);
      }
      iq.lane_pair = lane_pair;
      iq.simd = V::int4_fits(D, iq.group);
    }
    int16_t* natural = reinterpret_cast<int16_t*>(natural_scratch);
    // The rows, steps and sums are there already when the scratch holds this task's queries.
    for (int r = 0; r < (task.query_prepared ? 0 : num_rows); ++r) {
      const int qi = task.query_begin + r / G;
      const int head = task.kv_head * G + r % G;
      const float* src = w.q + (static_cast<size_t>(qi) * w.num_heads + head) * D;
      int16_t* row = q + static_cast<size_t>(r) * iq.qp;
      if constexpr (kIntTokenKeys) {
        for (size_t i = 0; i < iq.qp; ++i) row[i] = 0;
        step[r] = query_rounding::round_query_row(src, D, w.scale, row);
      } else {
        int16_t* nat = natural + static_cast<size_t>(r) * D;
        step[r] = query_rounding::round_query_row(src, D, w.scale, nat);
        float* pairs = qsum_pairs + static_cast<size_t>(r) * iq.pp;
        for (size_t i = 0; i < iq.pp; ++i) pairs[i] = 0.0f;
        for (int g = 0; g < num_groups; ++g) {
          int32_t sum = 0;
          for (int d = g * iq.group; d < (g + 1) * iq.group; ++d) sum += nat[d];
          pairs[2 * g + 1] = static_cast<float>(sum);
        }
        arrange_int4_query(nat, D, iq.simd ? V::kInt4Chunk : 0, iq.qp, row);
      }
    }
    iq.q = q;
    iq.step = step;
    iq.qsum_pairs = qsum_pairs;
    return iq;
  }

  // s[r, t] = q̂[r0 + r] · k[t] for NR rows: the ISA's sums in units of each row's step
  // (int8 keys: the integer dot product; int4: sum_g scale_g dot_g + min_g qsum_g), then
  // times the step and, for int8 keys, the token's scale.
  template <int NR>
  static void int_qk(const IntQuery& iq, int r0, const KRow* krows, int n, int D, float* s /*[NR, kTileTokens]*/) {
    const int16_t* q = iq.q + static_cast<size_t>(r0) * iq.qp;
    const int n_padded = (n + W - 1) / W * W;  // whole registers; entries past n are never used
    if constexpr (kIntTokenKeys) {
      V::template qk_int8<NR>(q, iq.qp, krows, n, D, s);
      alignas(64) float token_scale[kTileTokens];
      for (int t = 0; t < n; ++t) token_scale[t] = krows[t].scale;
      for (int t = n; t < n_padded; ++t) token_scale[t] = 0.0f;
      for (int r = 0; r < NR; ++r) {
        const Reg step = V::set1(iq.step[r0 + r]);
        float* row = s + r * kTileTokens;
        for (int t = 0; t < n_padded; t += W) V::store(row + t, V::mul(V::load(row + t), V::mul(step, V::load(token_scale + t))));
      }
    } else {
      const float* pairs = iq.qsum_pairs + static_cast<size_t>(r0) * iq.pp;
      if (iq.simd) {
        V::template qk_int4<NR>(q, iq.qp, pairs, iq.pp, iq.lane_pair, krows, n, D, iq.group, s);
      } else {
        qk_int4_scalar<V, NR>(q, iq.qp, pairs, iq.pp, krows, n, D, iq.group, s);
      }
      for (int r = 0; r < NR; ++r) {
        const Reg step = V::set1(iq.step[r0 + r]);
        float* row = s + r * kTileTokens;
        for (int t = 0; t < n_padded; t += W) V::store(row + t, V::mul(V::load(row + t), step));
      }
    }
  }

  // How many of the `remaining` rows the next row block takes. Sanitized builds (tests only) take
  // 8 or 1, so with_rows instantiates 2 of the 8 row counts (still both token blockings of the
  // integer q·k, NR <= 4 and NR > 4): every (K, V) pair's kernels compile in about a quarter of
  // the time under ASan and TSan, and the results are the same (each row's scores and sums do not
  // depend on the rows beside it). Release builds all 8.
  static int row_block(int remaining) {
    const int nr = min_int(kMaxRowBlock, remaining);
#ifdef KVLM_SANITIZED_BUILD
    return nr >= 8 ? 8 : 1;
#else
    return nr;
#endif
  }

  template <class F>
  static void with_rows(int nr, F&& f) {
    switch (nr) {
      case 1: f(std::integral_constant<int, 1>{}); break;
#ifndef KVLM_SANITIZED_BUILD
      case 2: f(std::integral_constant<int, 2>{}); break;
      case 3: f(std::integral_constant<int, 3>{}); break;
      case 4: f(std::integral_constant<int, 4>{}); break;
      case 5: f(std::integral_constant<int, 5>{}); break;
      case 6: f(std::integral_constant<int, 6>{}); break;
      case 7: f(std::integral_constant<int, 7>{}); break;
#endif
      default: f(std::integral_constant<int, 8>{}); break;
    }
  }

  // Online softmax over one tile for one row: turns the row's scores into
  // weights p (in place) relative to the updated running max, and rescales the
  // running sum and accumulator when the max grows.
  // Only the row's visible tokens [lo, hi) of the tile count; the others get weight 0.
  static void softmax_update(float* s /*[kTileTokens]*/, int lo, int hi, float& m, float& l, float* acc /*[Dv]*/,
                             int Dv) {
    if (hi <= lo) {  // nothing visible to this row here: zero weights
      for (int t = 0; t < kTileTokens; t += W) V::store(s + t, V::zero());
      return;
    }
    for (int t = 0; t < lo; ++t) s[t] = kNegInf;
    for (int t = hi; t < kTileTokens; ++t) s[t] = kNegInf;
    Reg vmax = V::load(s);
    for (int t = W; t < kTileTokens; t += W) vmax = V::max(vmax, V::load(s + t));
    const float tile_max = V::reduce_max(vmax);
    const float m_new = m > tile_max ? m : tile_max;
    const Reg neg_m = V::set1(-m_new);
    Reg vsum = V::zero();
    for (int t = 0; t < kTileTokens; t += W) {
      const Reg p = V::exp(V::add(V::load(s + t), neg_m));
      V::store(s + t, p);
      vsum = V::add(vsum, p);
    }
    const float tile_sum = V::reduce_add(vsum);
    if (m_new > m) {  // the running max grew: earlier terms shrink by exp(m - m_new)
      const float alpha = scalar_exp(m - m_new);
      l *= alpha;
      const Reg valpha = V::set1(alpha);
      for (int d = 0; d < Dv; d += W) V::store(acc + d, V::mul(V::load(acc + d), valpha));
      m = m_new;
    }
    l += tile_sum;
  }

  // exp of one value through the vector exp, so every path rounds the same way.
  static float scalar_exp(float x) {
    alignas(64) float buf[W];
    V::store(buf, V::exp(V::set1(x)));
    return buf[0];
  }

  static void run(const AttentionWork& w, const AttentionTask& task) {
    count_kernel_family_run(V::kFamily);
    const int D = w.layout.head_dim;
    const int Dv = kLatent ? w.value_dim : D;  // values per output row
    const int G = w.group_size;
    const int bs = w.layout.block_size;
    const int H = w.num_heads;
    const int num_rows = (task.query_end - task.query_begin) * G;
    // The first query that is a cache token: queries are the last num_queries tokens.
    const int first_query_pos = w.num_context_tokens - w.num_queries;

    float* qs = task.scratch;                                          // [num_rows, D], pre-scaled
    float* acc = qs + static_cast<size_t>(num_rows) * D;               // [num_rows, Dv]
    float* m = acc + static_cast<size_t>(num_rows) * D;                // [num_rows]
    float* l = m + num_rows;                                           // [num_rows]
    // A tile's key and value metadata as f32 (convert_meta), 2 × D floats per token: the
    // values' (scale, min) pairs per token, KIVI keys' channel scales and mins per run.
    float* k_meta = l + num_rows;                                      // [kTileTokens, 2 * D]
    float* v_meta = k_meta + kTileTokens * 2 * D;                      // [kTileTokens, <= 2 * D]
    for (int r = 0; r < num_rows; ++r) {
      const int qi = task.query_begin + r / G;
      const int head = task.kv_head * G + r % G;
      const float* src = w.q + (static_cast<size_t>(qi) * H + head) * D;
      if constexpr (!kIntKeys) {
        if (!task.query_prepared) {
          for (int d = 0; d < D; ++d) qs[static_cast<size_t>(r) * D + d] = src[d] * w.scale;
        }
      }
      for (int d = 0; d < Dv; ++d) acc[static_cast<size_t>(r) * Dv + d] = 0.0f;
      m[r] = kNegInf;
      l[r] = 0.0f;
    }
    // Integer keys: the rounded rows live after l; qs (unused then) holds their natural order.
    IntQuery iq;
    if constexpr (kIntKeys) iq = prepare_int_query(w, task, num_rows, v_meta + kTileTokens * 2 * D, qs);
    // Tokens row r may see: [token_begin, row_end(r)); rows are in query order, so
    // row_end never decreases with r.
    auto row_end = [&](int r) {
      return min_int(task.token_end, first_query_pos + task.query_begin + r / G + 1);
    };
    const int end = row_end(num_rows - 1);
    // Under a sliding window, row r's first visible token; it never decreases with r either.
    auto row_begin = [&](int r) {
      if (w.query_first_token == nullptr) return task.token_begin;
      return max_int(task.token_begin, w.query_first_token[task.query_begin + r / G]);
    };
    const int begin = row_begin(0);

    alignas(64) float s[kMaxRowBlock * kTileTokens] = {};  // scores, then weights
    KRow krows[kTileTokens];
    VRow vrows_own[kLatent ? 1 : kTileTokens];  // a latent layout's V rows are krows
    VRow* const vrows = [&]() -> VRow* {
      if constexpr (kLatent) return krows;
      else return vrows_own;
    }();
    // Calls visit(i, k_block, v_block, slot_begin, slot_end) for each run of
    // tokens [t0, t1) that share a block; i is the run's first token minus t0.
    auto visit_runs = [&](int t0, int t1, auto&& visit) {
      for (int t = t0; t < t1;) {
        const size_t block = static_cast<size_t>(w.block_table[t / bs]);
        const int slot = t % bs;
        const int run = min_int(bs - slot, t1 - t);
        const BlockRef kb{w.k_arena + block * w.k_block_bytes, w.k_staged ? w.k_staged[block] : nullptr};
        if constexpr (kLatent) {
          visit(t - t0, kb, kb, slot, slot + run);
        } else {
          const BlockRef vb{w.v_arena + block * w.v_block_bytes, w.v_staged ? w.v_staged[block] : nullptr};
          visit(t - t0, kb, vb, slot, slot + run);
        }
        t += run;
      }
    };
    // K/V rows of tokens [t0, t1) ahead of the one computing (attention_loaders.h), into L2
    // (to_l2: std::true_type) or L1.
    auto prefetch_tokens = [&](auto to_l2, int t0, int t1, bool keys, bool values) {
      constexpr bool kToL2 = decltype(to_l2)::value;
      visit_runs(t0, min_int(t1, end), [&](int, const BlockRef& kb, const BlockRef& vb, int s0, int s1) {
        if (keys) KL::template prefetch_slots<kToL2>(kb, w.layout, task.kv_head, s0, s1);
        if constexpr (!kLatent) {
          if (values) VL::template prefetch_slots<kToL2>(vb, w.layout, task.kv_head, s0, s1);
        }
      });
    };
    constexpr std::true_type kL2{};
    constexpr std::false_type kL1{};
    prefetch_tokens(kL2, begin, begin + kPrefetchFarTiles * kTileTokens, true, true);
    prefetch_tokens(kL1, begin, begin + kPrefetchTiles * kTileTokens, true, true);
    for (int t0 = begin; t0 < end; t0 += kTileTokens) {
      const int t1 = min_int(t0 + kTileTokens, end);
      // The tile kPrefetchTiles ahead comes into L1 in two bursts beside the compute rather
      // than one before it: its keys before q·k, its values after.
      const int a0 = t0 + kPrefetchTiles * kTileTokens, a1 = t1 + kPrefetchTiles * kTileTokens;
      prefetch_tokens(kL2, t0 + kPrefetchFarTiles * kTileTokens, t1 + kPrefetchFarTiles * kTileTokens, true, true);
      prefetch_tokens(kL1, a0, a1, true, false);
      bool values_ahead = false;
      visit_runs(t0, t1, [&](int i, const BlockRef& kb, const BlockRef& vb, int s0, int s1) {
        const int first = i;
        KL::rows(kb, w.layout, task.kv_head, s0, s1, krows + first);
        if constexpr (!kLatent) VL::rows(vb, w.layout, task.kv_head, s0, s1, vrows + first);
        // Integer keys read their f16 metadata themselves (int_qk): nothing to convert for them.
        if constexpr (!kIntKeys && requires { KL::convert_meta(kb, w.layout, 0, 0, 0, k_meta, krows); }) {
          KL::convert_meta(kb, w.layout, task.kv_head, s0, s1, k_meta + static_cast<size_t>(first) * 2 * D,
                           krows + first);
        }
        if constexpr (requires { VL::convert_meta(vb, w.layout, 0, 0, 0, v_meta, vrows); }) {
          VL::convert_meta(vb, w.layout, task.kv_head, s0, s1, v_meta + static_cast<size_t>(first) * 2 * D,
                           vrows + first);
        }
      });
      for (int r0 = 0, nr = 0; r0 < num_rows; r0 += nr) {
        nr = row_block(num_rows - r0);
        const int n = min_int(t1, row_end(r0 + nr - 1)) - t0;  // tokens the block's last row sees
        if (n <= 0 || row_begin(r0) >= t1) continue;  // no row of the block sees this tile
        const float* q_block = qs + static_cast<size_t>(r0) * D;
        float* acc_block = acc + static_cast<size_t>(r0) * Dv;
        if constexpr (kIntKeys) {
          with_rows(nr, [&](auto rows) { int_qk<rows()>(iq, r0, krows, n, D, s); });
        } else {
          with_rows(nr, [&](auto rows) { qk<rows()>(q_block, krows, n, D, s); });
        }
        if (!values_ahead) {
          prefetch_tokens(kL1, a0, a1, false, true);
          values_ahead = true;
        }
        for (int i = 0; i < nr; ++i) {
          const int hi = max_int(0, min_int(n, row_end(r0 + i) - t0));
          const int lo = max_int(0, row_begin(r0 + i) - t0);
          const int r = r0 + i;
          if (w.scores != nullptr && hi > lo && task.query_begin + r / G >= w.first_score_query) {
            const size_t row = static_cast<size_t>(task.query_begin + r / G - w.first_score_query) *
                                   static_cast<size_t>(H) +
                               static_cast<size_t>(task.kv_head * G + r % G);
            float* dst = w.scores + row * static_cast<size_t>(w.num_context_tokens) + t0;
            for (int t = lo; t < hi; ++t) dst[t] = s[i * kTileTokens + t];
          }
          softmax_update(s + i * kTileTokens, lo, hi, m[r0 + i], l[r0 + i], acc_block + static_cast<size_t>(i) * Dv,
                         Dv);
        }
        with_rows(nr, [&](auto rows) { pv<rows()>(s, vrows, n, Dv, acc_block); });
      }
      if (!values_ahead) prefetch_tokens(kL1, a0, a1, false, true);  // no row block saw this tile
    }

    for (int r = 0; r < num_rows; ++r) {
      const int qi = task.query_begin + r / G;
      const size_t row = static_cast<size_t>(qi) * H + static_cast<size_t>(task.kv_head * G + r % G);
      const float* a = acc + static_cast<size_t>(r) * Dv;
      if (task.out != nullptr) {
        // Every query sees at least cache token 0, so l > 0 when the task covers the whole context.
        const float inv = 1.0f / l[r];
        float* o = task.out + row * Dv;
        for (int d = 0; d < Dv; ++d) o[d] = a[d] * inv;
      } else {
        task.partial_max[row] = m[r];
        task.partial_sum[row] = l[r];
        float* o = task.partial_acc + row * Dv;
        for (int d = 0; d < Dv; ++d) o[d] = a[d];
      }
    }
  }
};

// The kernel for one (K type, V type) pair on ISA ops V.
template <class V>
AttentionKernelFn select_kernel(KvType k_type, KvType v_type) {
  auto with_v = [&]<class KL>() -> AttentionKernelFn {
    switch (v_type) {
      case KvType::kF32:
        return &AttentionKernel<V, KL, PlainLoader<V, KvType::kF32>>::run;
      case KvType::kF16:
        return &AttentionKernel<V, KL, PlainLoader<V, KvType::kF16>>::run;
      case KvType::kBf16:
        return &AttentionKernel<V, KL, PlainLoader<V, KvType::kBf16>>::run;
      case KvType::kFp8:
        return &AttentionKernel<V, KL, ScaledLoader<V, KvType::kFp8>>::run;
      case KvType::kInt8:
        return &AttentionKernel<V, KL, ScaledLoader<V, KvType::kInt8>>::run;
      case KvType::kInt4:
        return &AttentionKernel<V, KL, GroupLoader<V, KvType::kInt4, false>>::run;
      case KvType::kKivi4:
        return &AttentionKernel<V, KL, GroupLoader<V, KvType::kKivi4, true>>::run;
      case KvType::kKivi2:
        return &AttentionKernel<V, KL, GroupLoader<V, KvType::kKivi2, true>>::run;
    }
    return nullptr;
  };
  switch (k_type) {
    case KvType::kF32:
      return with_v.template operator()<PlainLoader<V, KvType::kF32>>();
    case KvType::kF16:
      return with_v.template operator()<PlainLoader<V, KvType::kF16>>();
    case KvType::kBf16:
      return with_v.template operator()<PlainLoader<V, KvType::kBf16>>();
    case KvType::kFp8:
      return with_v.template operator()<ScaledLoader<V, KvType::kFp8>>();
    case KvType::kInt8:
      return with_v.template operator()<ScaledLoader<V, KvType::kInt8>>();
    case KvType::kInt4:
      return with_v.template operator()<GroupLoader<V, KvType::kInt4, false>>();
    case KvType::kKivi4:
      return with_v.template operator()<ChannelLoader<V, KvType::kKivi4>>();
    case KvType::kKivi2:
      return with_v.template operator()<ChannelLoader<V, KvType::kKivi2>>();
  }
  return nullptr;
}

// The kernel for a latent layout whose rows are `row_type` (no KIVI: nullptr) on ISA ops V.
template <class V>
AttentionKernelFn select_latent_kernel(KvType row_type) {
  auto of = [&]<class L>() -> AttentionKernelFn { return &AttentionKernel<V, L, L, true>::run; };
  switch (row_type) {
    case KvType::kF32:
      return of.template operator()<PlainLoader<V, KvType::kF32>>();
    case KvType::kF16:
      return of.template operator()<PlainLoader<V, KvType::kF16>>();
    case KvType::kBf16:
      return of.template operator()<PlainLoader<V, KvType::kBf16>>();
    case KvType::kFp8:
      return of.template operator()<ScaledLoader<V, KvType::kFp8>>();
    case KvType::kInt8:
      return of.template operator()<ScaledLoader<V, KvType::kInt8>>();
    case KvType::kInt4:
      return of.template operator()<GroupLoader<V, KvType::kInt4, false>>();
    case KvType::kKivi4:
    case KvType::kKivi2:
      break;  // KvStorage refuses KIVI for latent layouts
  }
  return nullptr;
}

}  // namespace
}  // namespace kvlm::attention_internal

#undef KVLM_ATTENTION_UNROLL
