// AVX-512 attention kernels: 16 lanes, head_dim % 16 == 0.
// GCC 12 reports its own _mm512_undefined_* helpers (self-initialised on purpose)
// as (maybe-)uninitialized once they are inlined into our loops; nothing of ours is.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <immintrin.h>

#include "attention/attention_kernel.h"
#include "attention/attention_kernel_impl.h"

namespace kvlm::attention_internal {
namespace {

// Upper 8 lanes, with AVX512F only (extractf32x8 would need DQ).
inline __m256 upper_half(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }

struct Avx512Ops {
  using Reg = __m512;
  static constexpr int kWidth = 16;
  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
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
  static Reg load_u2(const uint8_t* codes, int d) {
    uint32_t word;
    __builtin_memcpy(&word, codes + d / 4, sizeof word);
    const __m512i shifts = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i shifted = _mm512_srlv_epi32(_mm512_set1_epi32(static_cast<int>(word)), shifts);
    return _mm512_cvtepi32_ps(_mm512_and_si512(shifted, _mm512_set1_epi32(0x3)));
  }
};

}  // namespace

AttentionKernelFn attention_kernel_avx512(KvType k_type, KvType v_type) {
  return select_kernel<Avx512Ops>(k_type, v_type);
}

}  // namespace kvlm::attention_internal
