// AVX2 + FMA + F16C attention kernels: 8 lanes, head_dim % 8 == 0.
#include <immintrin.h>

#include "attention/attention_kernel.h"
#include "attention/attention_kernel_impl.h"

namespace kvlm::attention_internal {
namespace {

struct Avx2Ops {
  static constexpr KernelFamily kFamily = KernelFamily::kAvx2;
  using Reg = __m256;
  static constexpr int kWidth = 8;
  static Reg zero() { return _mm256_setzero_ps(); }
  static Reg load(const float* p) { return _mm256_loadu_ps(p); }
  // A load that stays one register: without the empty asm the compiler folds a value used by
  // several FMAs into each of them as a memory operand, and the loads, not the FMAs, bound q·k.
  static Reg load_reg(const float* p) {
    Reg r = _mm256_loadu_ps(p);
    asm("" : "+x"(r));
    return r;
  }
  static void store(float* p, Reg v) { _mm256_storeu_ps(p, v); }
  static Reg set1(float x) { return _mm256_set1_ps(x); }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  static Reg add(Reg a, Reg b) { return _mm256_add_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
  static Reg max(Reg a, Reg b) { return _mm256_max_ps(a, b); }
  static float reduce_add(Reg v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }
  static float reduce_max(Reg v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }
  // 16 registers: NR × TB accumulators + TB keys + a query; NR × DB accumulators + NR weights + a value.
  template <int NR>
  static constexpr int qk_tokens() { return NR <= 2 ? 4 : NR <= 4 ? 2 : 1; }
  template <int NR>
  static constexpr int pv_chunks() { return NR == 1 ? 8 : NR == 2 ? 4 : NR <= 4 ? 2 : 1; }
  template <int N>
  static void reduce_add_n(const Reg* v, float* out) {
    if constexpr (N == 1) {
      out[0] = reduce_add(v[0]);
    } else if constexpr (N == 2) {
      const __m256 h = _mm256_hadd_ps(v[0], v[1]);  // [a01 a23 b01 b23 | a45 a67 b45 b67]
      __m128 x = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
      x = _mm_hadd_ps(x, x);  // [a b a b]
      _mm_storel_pi(reinterpret_cast<__m64*>(out), x);
    } else {
      static_assert(N == 4);
      const __m256 ab = _mm256_hadd_ps(v[0], v[1]);
      const __m256 cd = _mm256_hadd_ps(v[2], v[3]);
      const __m256 abcd = _mm256_hadd_ps(ab, cd);  // [a b c d | a b c d], halves of each sum
      _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1)));
    }
  }
  // e^x as 2^n × e^r with |r| <= ln2/2 and a degree-6 polynomial for e^r
  // (Cephes expf coefficients, about 1 ulp); 0 below -87.3, the f32 normal range.
  static Reg exp(Reg x) {
    const Reg lo = _mm256_set1_ps(-87.33654f);
    const Reg xc = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.3762626647949f));
    const Reg n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    Reg r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    Reg p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    const Reg y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    const Reg result = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    return _mm256_and_ps(result, _mm256_cmp_ps(x, lo, _CMP_GE_OQ));
  }

  // Element conversions for the loaders (attention_kernel_impl.h); d % 8 == 0.
  static float half(uint16_t h) { return _cvtsh_ss(h); }
  static Reg load_f32(const float* p) { return _mm256_loadu_ps(p); }
  static Reg load_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static Reg load_bf16(const uint16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static Reg load_i8(const uint8_t* codes, int d) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + d))));
  }
  // E4M3 bits moved into f16's fields: the f16 of value / 256 (kv_codec.h).
  static Reg load_fp8(const uint8_t* codes, int d) {
    const __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + d)));
    const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8),
                                   _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7f)), 7));
    return _mm256_cvtph_ps(h);
  }
  static Reg load_u4(const uint8_t* codes, int d) {
    uint32_t word;
    __builtin_memcpy(&word, codes + d / 2, sizeof word);
    const __m256i shifted = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(word)),
                                              _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    return _mm256_cvtepi32_ps(_mm256_and_si256(shifted, _mm256_set1_epi32(0xf)));
  }
  template <int N>
  static void load_u4_n(const uint8_t* codes, int d, Reg* out) {
    for (int j = 0; j < N; ++j) out[j] = load_u4(codes, d + j * kWidth);
  }
  static Reg load_u2(const uint8_t* codes, int d) {
    uint16_t word;
    __builtin_memcpy(&word, codes + d / 4, sizeof word);
    const __m256i shifted = _mm256_srlv_epi32(_mm256_set1_epi32(word), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
    return _mm256_cvtepi32_ps(_mm256_and_si256(shifted, _mm256_set1_epi32(0x3)));
  }

  // Integer q·k (query_rounding.h) with pmaddwd: 16-bit products summed in pairs into 8 int32 lanes.
  // Bytes [0, n) of p, zero above; n <= 16.
  static __m128i load_partial(const uint8_t* p, int n) {
    if (n == 16) return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if (n == 8) return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    alignas(16) uint8_t buf[16] = {};
    __builtin_memcpy(buf, p, static_cast<size_t>(n));
    return _mm_load_si128(reinterpret_cast<const __m128i*>(buf));
  }

  // int8 keys: chunks of 16 values (8 at the end when head_dim % 16 == 8).
  template <int NR, int TB, class Row>
  static void qk_int8_step(const int16_t* q, size_t qp, const Row* rows, int t, int D, float* s) {
    __m256i acc[NR][TB];
    _Pragma("GCC unroll 8")
    for (int r = 0; r < NR; ++r) {
      _Pragma("GCC unroll 8")
      for (int j = 0; j < TB; ++j) acc[r][j] = _mm256_setzero_si256();
    }
    for (int d = 0; d < D; d += 16) {
      const int n = D - d < 16 ? D - d : 16;
      __m256i k[TB];
      _Pragma("GCC unroll 8")
      for (int j = 0; j < TB; ++j) k[j] = _mm256_cvtepi8_epi16(load_partial(rows[t + j].codes + d, n));
      _Pragma("GCC unroll 8")
      for (int r = 0; r < NR; ++r) {
        const __m256i qr = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + r * qp + d));
        _Pragma("GCC unroll 8")
        for (int j = 0; j < TB; ++j) acc[r][j] = _mm256_add_epi32(acc[r][j], _mm256_madd_epi16(k[j], qr));
      }
    }
    _Pragma("GCC unroll 8")
    for (int r = 0; r < NR; ++r) {
      Reg f[TB];
      _Pragma("GCC unroll 8")
      for (int j = 0; j < TB; ++j) f[j] = _mm256_cvtepi32_ps(acc[r][j]);
      reduce_add_n<TB>(f, s + r * kTileTokens + t);
    }
  }
  template <int NR, class Row>
  static void qk_int8(const int16_t* q, size_t qp, const Row* rows, int n, int D, float* s) {
    constexpr int TB = NR <= 4 ? 2 : 1;
    int t = 0;
    for (; t + TB <= n; t += TB) qk_int8_step<NR, TB>(q, qp, rows, t, D, s);
    for (; t < n; ++t) qk_int8_step<NR, 1>(q, qp, rows, t, D, s);
  }

  // int4 keys: chunks of 32 values (16 code bytes). Lane i of a chunk's sum holds values
  // [4i, 4i + 4), inside one group (g >= 8), so it is scaled by that group's scale. A row is
  // scored in segments of kInt4SegmentGroups groups, whose (scale, min) pairs fill one register;
  // lane_pair indexes a segment's pairs, the same pattern in every segment.
  static constexpr int kInt4Chunk = 32;
  static constexpr int kInt4SegmentGroups = 4;
  static bool int4_fits(int, int) { return true; }  // head_dim % 8 == 0: groups of 8, 16 or 32
  // One segment of a row, values [s0, min(D, s0 + segment)): adds its terms to acc (the first
  // segment sets acc).
  template <int NR, int TB, bool kFirst, class Row>
  [[gnu::always_inline]] static void qk_int4_segment(const int16_t* q, size_t qp, const float* qsum_pairs, size_t pp, const Row* rows, int t,
                              int D, int g, int s0, const __m256i* lane_scales, Reg (&acc)[NR][TB]) {
    const __m128i nibble = _mm_set1_epi8(0x0f);
    const int segment = kInt4SegmentGroups * g;  // values, a multiple of the chunk
    const int num_groups = (D - s0) / g < kInt4SegmentGroups ? (D - s0) / g : kInt4SegmentGroups;
    const int pair0 = 2 * (s0 / g);  // the segment's first (scale, min) float among the row's
    Reg pairs[TB];  // [scale, min] per group of the segment, as f32
    _Pragma("GCC unroll 8")
    for (int j = 0; j < TB; ++j) {
      pairs[j] = _mm256_cvtph_ps(load_partial(rows[t + j].meta + 2 * pair0, num_groups * 4));
      // The min term sum_g min_g qsum_g, summed with the lanes at the end.
      _Pragma("GCC unroll 8")
      for (int r = 0; r < NR; ++r) {
        const Reg qsum = _mm256_loadu_ps(qsum_pairs + r * pp + pair0);
        acc[r][j] = kFirst ? _mm256_mul_ps(pairs[j], qsum) : _mm256_fmadd_ps(pairs[j], qsum, acc[r][j]);
      }
    }
    const int s1 = s0 + segment < D ? s0 + segment : D;
    for (int d = s0; d < s1; d += 32) {
      const int n = D - d < 32 ? (D - d) / 2 : 16;
      const __m256i idx = lane_scales[(d - s0) / 32];
      __m256i lo[TB], hi[TB];
      Reg scale[TB];
      _Pragma("GCC unroll 8")
      for (int j = 0; j < TB; ++j) {
        const __m128i b = load_partial(rows[t + j].codes + d / 2, n);
        lo[j] = _mm256_cvtepu8_epi16(_mm_and_si128(b, nibble));
        hi[j] = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(b, 4), nibble));
        scale[j] = _mm256_permutevar8x32_ps(pairs[j], idx);
      }
      _Pragma("GCC unroll 8")
      for (int r = 0; r < NR; ++r) {
        const __m256i q_even = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + r * qp + d));
        const __m256i q_odd = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + r * qp + d + 16));
        _Pragma("GCC unroll 8")
        for (int j = 0; j < TB; ++j) {
          const __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(lo[j], q_even), _mm256_madd_epi16(hi[j], q_odd));
          acc[r][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), scale[j], acc[r][j]);
        }
      }
    }
  }
  template <int NR, int TB, class Row>
  static void qk_int4_step(const int16_t* q, size_t qp, const float* qsum_pairs, size_t pp, const Row* rows, int t,
                           int D, int g, const __m256i* lane_scales, float* s) {
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
    __m256i lane_scales[4];  // one segment's chunks: at most 4 groups of at most 32 values
    for (int d = 0; d < D && d < kInt4SegmentGroups * g; d += 32) {
      lane_scales[d / 32] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lane_pair + d / 4));
    }
    constexpr int TB = NR <= 2 ? 2 : 1;
    int t = 0;
    for (; t + TB <= n; t += TB) qk_int4_step<NR, TB>(q, qp, qsum_pairs, pp, rows, t, D, g, lane_scales, s);
    for (; t < n; ++t) qk_int4_step<NR, 1>(q, qp, qsum_pairs, pp, rows, t, D, g, lane_scales, s);
  }
};

}  // namespace

AttentionKernelFn attention_kernel_avx2(KvType k_type, KvType v_type) {
  return select_kernel<Avx2Ops>(k_type, v_type);
}

AttentionKernelFn latent_attention_kernel_avx2(KvType row_type) {
  return select_latent_kernel<Avx2Ops>(row_type);
}

}  // namespace kvlm::attention_internal
