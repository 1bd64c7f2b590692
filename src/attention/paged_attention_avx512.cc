// AVX-512 attention kernels: 16 lanes, head_dim % 16 == 0.
// GCC 12 reports its own _mm512_undefined_* helpers (self-initialised on purpose)
// as (maybe-)uninitialized once they are inlined into our loops; nothing of ours is.
#if !defined(__clang__)  // clang has no -Wmaybe-uninitialized
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <immintrin.h>

#include "attention/attention_kernel.h"
#include "attention/attention_kernel_impl.h"

namespace kvlm::attention_internal {
namespace {

// Upper 8 lanes, with AVX512F only (extractf32x8 would need DQ).
inline __m256 upper_half(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }

struct Avx512Ops {
  static constexpr KernelFamily kFamily = KernelFamily::kAvx512;
  using Reg = __m512;
  static constexpr int kWidth = 16;
  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  // A load that stays one register: without the empty asm the compiler folds a value used by
  // several FMAs into each of them as a memory operand, and the loads, not the FMAs, bound q·k.
  static Reg load_reg(const float* p) {
    Reg r = _mm512_loadu_ps(p);
    asm("" : "+v"(r));
    return r;
  }
  static void store(float* p, Reg v) { _mm512_storeu_ps(p, v); }
  static Reg set1(float x) { return _mm512_set1_ps(x); }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  static Reg add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static Reg max(Reg a, Reg b) { return _mm512_max_ps(a, b); }
  static float reduce_add(Reg v) {
    __m256 y = _mm256_add_ps(_mm512_castps512_ps256(v), upper_half(v));
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(y), _mm256_extractf128_ps(y, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }
  static float reduce_max(Reg v) {
    __m256 y = _mm256_max_ps(_mm512_castps512_ps256(v), upper_half(v));
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(y), _mm256_extractf128_ps(y, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }
  // 32 registers: NR × TB accumulators + TB keys + a query; NR × DB accumulators + NR weights + a value.
  template <int NR>
  static constexpr int qk_tokens() { return NR <= 4 ? 4 : 2; }
  template <int NR>
  static constexpr int pv_chunks() { return NR <= 2 ? 8 : NR <= 4 ? 4 : 2; }
  // Sums of N vectors at once: halve the 512-bit lanes while interleaving the
  // vectors, so N sums cost about as much as one.
  template <int N>
  static void reduce_add_n(const Reg* v, float* out) {
    if constexpr (N == 1) {
      out[0] = reduce_add(v[0]);
    } else if constexpr (N == 2) {
      // [a.q0+a.q2, a.q1+a.q3, b.q0+b.q2, b.q1+b.q3] (q = 128-bit quarter)
      Reg x = _mm512_add_ps(_mm512_shuffle_f32x4(v[0], v[1], _MM_SHUFFLE(1, 0, 1, 0)),
                            _mm512_shuffle_f32x4(v[0], v[1], _MM_SHUFFLE(3, 2, 3, 2)));
      x = _mm512_add_ps(x, _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(2, 3, 0, 1)));  // [a4 a4 b4 b4]
      out[0] = reduce_quarter(_mm512_castps512_ps128(x));
      out[1] = reduce_quarter(_mm512_extractf32x4_ps(x, 2));
    } else {
      static_assert(N == 4);
      const Reg ab = _mm512_add_ps(_mm512_shuffle_f32x4(v[0], v[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(v[0], v[1], _MM_SHUFFLE(3, 2, 3, 2)));
      const Reg cd = _mm512_add_ps(_mm512_shuffle_f32x4(v[2], v[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(v[2], v[3], _MM_SHUFFLE(3, 2, 3, 2)));
      // [a4 b4 c4 d4]: quarter i holds four partial sums of vector i.
      Reg x = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
      x = _mm512_add_ps(x, _mm512_permute_ps(x, _MM_SHUFFLE(1, 0, 3, 2)));
      x = _mm512_add_ps(x, _mm512_permute_ps(x, _MM_SHUFFLE(2, 3, 0, 1)));  // every lane of quarter i: sum i
      const __m512i first_lanes = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0);
      _mm_storeu_ps(out, _mm512_castps512_ps128(_mm512_permutexvar_ps(first_lanes, x)));
    }
  }
  static float reduce_quarter(__m128 x) {
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }
  // Same method and constants as the AVX2 exp; scalef applies 2^n.
  static Reg exp(Reg x) {
    const Reg lo = _mm512_set1_ps(-87.33654f);
    const Reg xc = _mm512_min_ps(_mm512_max_ps(x, lo), _mm512_set1_ps(88.3762626647949f));
    const Reg n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    Reg r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    Reg p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    const Reg y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ), _mm512_scalef_ps(y, n));
  }

  // Element conversions for the loaders (attention_kernel_impl.h); d % 16 == 0.
  static float half(uint16_t h) { return _cvtsh_ss(h); }
  static Reg load_f32(const float* p) { return _mm512_loadu_ps(p); }
  static Reg load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static Reg load_bf16(const uint16_t* p) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static Reg load_i8(const uint8_t* codes, int d) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + d))));
  }
  // E4M3 bits moved into f16's fields: the f16 of value / 256 (kv_codec.h).
  static Reg load_fp8(const uint8_t* codes, int d) {
    const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + d)));
    const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8),
                                      _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)), 7));
    return _mm512_cvtph_ps(h);
  }
  // 16 nibbles from 8 bytes: split low and high nibbles, interleave them back into order.
  static Reg load_u4(const uint8_t* codes, int d) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + d / 2));
    const __m128i mask = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(b, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
  }
  // N chunks of 16 nibbles: 32 at a time from 16 bytes (low and high nibbles interleaved
  // back into order by unpacklo/hi), which halves the unpacking work per value.
  template <int N>
  static void load_u4_n(const uint8_t* codes, int d, Reg* out) {
    int j = 0;
    for (; j + 2 <= N; j += 2) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + (d + j * kWidth) / 2));
      const __m128i mask = _mm_set1_epi8(0x0f);
      const __m128i lo = _mm_and_si128(b, mask);
      const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
      out[j] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
      out[j + 1] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi)));
    }
    if (j < N) out[j] = load_u4(codes, d + j * kWidth);
  }
  static Reg load_u2(const uint8_t* codes, int d) {
    uint32_t word;
    __builtin_memcpy(&word, codes + d / 4, sizeof word);
    const __m512i shifts = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i shifted = _mm512_srlv_epi32(_mm512_set1_epi32(static_cast<int>(word)), shifts);
    return _mm512_cvtepi32_ps(_mm512_and_si512(shifted, _mm512_set1_epi32(0x3)));
  }

  // Integer q·k (query_rounding.h) with VNNI's vpdpwssd: 16-bit products summed in pairs
  // into 16 int32 lanes, accumulating in one instruction.
  static __mmask32 byte_mask(int n) { return n >= 32 ? ~__mmask32{0} : (__mmask32{1} << n) - 1; }

  // acc += the pairwise products of a and b (vpdpwssd). In asm because GCC 12, given the
  // intrinsic over an unrolled array of accumulators, copies every accumulator each iteration
  // (and spills some) instead of updating it in place.
  static void dpwssd(__m512i& acc, __m512i a, __m512i b) { asm("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b)); }

  // int8 keys: chunks of 32 values (16 at the end when head_dim % 32 == 16).
  template <int NR, int TB, class Row>
  static void qk_int8_step(const int16_t* q, size_t qp, const Row* rows, int t, int D, float* s) {
    __m512i acc[NR][TB];
    _Pragma("GCC unroll 8")
    for (int r = 0; r < NR; ++r) {
      _Pragma("GCC unroll 8")
      for (int j = 0; j < TB; ++j) acc[r][j] = _mm512_setzero_si512();
    }
    for (int d = 0; d < D; d += 32) {
      const __mmask32 mask = byte_mask(D - d);
      __m512i k[TB];
      _Pragma("GCC unroll 8")
      for (int j = 0; j < TB; ++j) k[j] = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(mask, rows[t + j].codes + d));
      _Pragma("GCC unroll 8")
      for (int r = 0; r < NR; ++r) {
        const __m512i qr = _mm512_loadu_si512(q + r * qp + d);
        _Pragma("GCC unroll 8")
        for (int j = 0; j < TB; ++j) dpwssd(acc[r][j], k[j], qr);
      }
    }
    _Pragma("GCC unroll 8")
    for (int r = 0; r < NR; ++r) {
      Reg f[TB];
      _Pragma("GCC unroll 8")
      for (int j = 0; j < TB; ++j) f[j] = _mm512_cvtepi32_ps(acc[r][j]);
      reduce_add_n<TB>(f, s + r * kTileTokens + t);
    }
  }
  template <int NR, class Row>
  static void qk_int8(const int16_t* q, size_t qp, const Row* rows, int n, int D, float* s) {
    constexpr int TB = NR <= 4 ? 4 : 2;
    int t = 0;
    for (; t + TB <= n; t += TB) qk_int8_step<NR, TB>(q, qp, rows, t, D, s);
    for (; t < n; ++t) qk_int8_step<NR, 1>(q, qp, rows, t, D, s);
  }

  // int4 keys: chunks of 64 values (32 code bytes). Lane i of a chunk's sum holds values
  // [4i, 4i + 4), inside one group (g >= 16), so it is scaled by that group's scale. A row is
  // scored in segments of kInt4SegmentGroups groups, whose (scale, min) pairs fill one register;
  // lane_pair indexes a segment's pairs, the same pattern in every segment.
  static constexpr int kInt4Chunk = 64;
  static constexpr int kInt4SegmentGroups = 8;
  static bool int4_fits(int, int) { return true; }  // head_dim % 16 == 0: groups of 16 or 32
  // One segment of a row, values [s0, min(D, s0 + segment)): adds its terms to acc (the first
  // segment sets acc).
  template <int NR, int TB, bool kFirst, class Row>
  [[gnu::always_inline]] static void qk_int4_segment(const int16_t* q, size_t qp, const float* qsum_pairs, size_t pp, const Row* rows, int t,
                              int D, int g, int s0, const __m512i* lane_scales, Reg (&acc)[NR][TB]) {
    const __m256i nibble = _mm256_set1_epi8(0x0f);
    const int segment = kInt4SegmentGroups * g;  // values, a multiple of the chunk
    const int num_groups = (D - s0) / g < kInt4SegmentGroups ? (D - s0) / g : kInt4SegmentGroups;
    const int pair0 = 2 * (s0 / g);  // the segment's first (scale, min) float among the row's
    const __mmask16 meta_mask = static_cast<__mmask16>((1u << (2 * num_groups)) - 1);
    Reg pairs[TB];  // [scale, min] per group of the segment, as f32
    _Pragma("GCC unroll 8")
    for (int j = 0; j < TB; ++j) {
      pairs[j] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(meta_mask, rows[t + j].meta + 2 * pair0));
      // The min term sum_g min_g qsum_g, summed with the lanes at the end.
      _Pragma("GCC unroll 8")
      for (int r = 0; r < NR; ++r) {
        const Reg qsum = _mm512_loadu_ps(qsum_pairs + r * pp + pair0);
        acc[r][j] = kFirst ? _mm512_mul_ps(pairs[j], qsum) : _mm512_fmadd_ps(pairs[j], qsum, acc[r][j]);
      }
    }
    const int s1 = s0 + segment < D ? s0 + segment : D;
    for (int d = s0; d < s1; d += 64) {
      const __mmask32 mask = byte_mask((D - d) / 2);
      const __m512i idx = lane_scales[(d - s0) / 64];
      // Token by token, so that only the accumulators stay live across tokens.
      _Pragma("GCC unroll 8")
      for (int j = 0; j < TB; ++j) {
        const __m256i b = _mm256_maskz_loadu_epi8(mask, rows[t + j].codes + d / 2);
        const __m512i lo = _mm512_cvtepu8_epi16(_mm256_and_si256(b, nibble));
        const __m512i hi = _mm512_cvtepu8_epi16(_mm256_and_si256(_mm256_srli_epi16(b, 4), nibble));
        const Reg scale = _mm512_permutexvar_ps(idx, pairs[j]);
        _Pragma("GCC unroll 8")
        for (int r = 0; r < NR; ++r) {
          const __m512i q_even = _mm512_loadu_si512(q + r * qp + d);
          const __m512i q_odd = _mm512_loadu_si512(q + r * qp + d + 32);
          const __m512i sum = _mm512_dpwssd_epi32(_mm512_madd_epi16(lo, q_even), hi, q_odd);
          acc[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale, acc[r][j]);
        }
      }
    }
  }
  template <int NR, int TB, class Row>
  static void qk_int4_step(const int16_t* q, size_t qp, const float* qsum_pairs, size_t pp, const Row* rows, int t,
                           int D, int g, const __m512i* lane_scales, float* s) {
    Reg acc[NR][TB];
    qk_int4_segment<NR, TB, true>(q, qp, qsum_pairs, pp, rows, t, D, g, 0, lane_scales, acc);
    for (int s0 = kInt4SegmentGroups * g; s0 < D; s0 += kInt4SegmentGroups * g) {
      qk_int4_segment<NR, TB, false>(q, qp, qsum_pairs, pp, rows, t, D, g, s0, lane_scales, acc);
    }
    _Pragma("GCC unroll 8")
    for (int r = 0; r < NR; ++r) reduce_add_n<TB>(acc[r], s + r * kTileTokens + t);
  }
  template <int NR, class Row>
  static void qk_int4(const int16_t* q, size_t qp, const float* qsum_pairs, size_t pp, const int32_t* lane_pair,
                      const Row* rows, int n, int D, int g, float* s) {
    __m512i lane_scales[4];  // one segment's chunks: at most 8 groups of at most 32 values
    for (int d = 0; d < D && d < kInt4SegmentGroups * g; d += 64) {
      lane_scales[d / 64] = _mm512_loadu_si512(lane_pair + d / 4);
    }
    constexpr int TB = NR <= 4 ? 4 : 2;
    int t = 0;
    for (; t + TB <= n; t += TB) qk_int4_step<NR, TB>(q, qp, qsum_pairs, pp, rows, t, D, g, lane_scales, s);
    for (; t < n; ++t) qk_int4_step<NR, 1>(q, qp, qsum_pairs, pp, rows, t, D, g, lane_scales, s);
  }
};

}  // namespace

AttentionKernelFn attention_kernel_avx512(KvType k_type, KvType v_type) {
  return select_kernel<Avx512Ops>(k_type, v_type);
}

AttentionKernelFn latent_attention_kernel_avx512(KvType row_type) {
  return select_latent_kernel<Avx512Ops>(row_type);
}

}  // namespace kvlm::attention_internal
