// AVX2 + FMA + F16C attention kernels: 8 lanes, head_dim % 8 == 0.
#include <immintrin.h>

#include "attention/attention_kernel.h"
#include "attention/attention_kernel_impl.h"

namespace kvlm::attention_internal {
namespace {

struct Avx2Ops {
  using Reg = __m256;
  static constexpr int kWidth = 8;
  static Reg zero() { return _mm256_setzero_ps(); }
  static Reg load(const float* p) { return _mm256_loadu_ps(p); }
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
  static Reg load_u2(const uint8_t* codes, int d) {
    uint16_t word;
    __builtin_memcpy(&word, codes + d / 4, sizeof word);
    const __m256i shifted = _mm256_srlv_epi32(_mm256_set1_epi32(word), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
    return _mm256_cvtepi32_ps(_mm256_and_si256(shifted, _mm256_set1_epi32(0x3)));
  }
};

}  // namespace

AttentionKernelFn attention_kernel_avx2(KvType k_type, KvType v_type) {
  return select_kernel<Avx2Ops>(k_type, v_type);
}

}  // namespace kvlm::attention_internal
