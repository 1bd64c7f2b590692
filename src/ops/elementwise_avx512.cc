// AVX-512 kernels for rms_norm, silu_mul and softmax, with a vector exp.
// GCC 12's AVX-512 intrinsic headers seed results with _mm*_undefined_*(), which its own
// uninitialized-use warnings flag at every call site (GCC bug 105593); the code is fine.
#if !defined(__clang__)  // clang has no -Wmaybe-uninitialized
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cmath>

#include "ops/elementwise_kernels.h"

namespace kvlm::ops_internal {
namespace {

inline __mmask16 tail_mask(int64_t remaining) { return static_cast<__mmask16>((1u << remaining) - 1); }

// exp(x) = 2^n · e^r with n = round(x·log2 e) and |r| ≤ ln2/2; e^r by its Taylor series to
// r^7 (truncation < 6e-9 relative), so the result is within a few ulp. scalef applies 2^n
// with correct overflow to inf and underflow through subnormals to 0.
inline __m512 exp_ps(__m512 x) {
  // Operand order keeps NaN: max/min return the second operand when either is NaN.
  x = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-110.0f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // ln 2 split so that n · ln2_hi is exact for |n| < 512.
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723e-6f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// Adds v·v into two double accumulators (f32 squares summed in f64 lose nothing that matters).
inline void add_squares(__m512 v, __m512d& acc0, __m512d& acc1) {
  const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
  const __m512d hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1));
  acc0 = _mm512_fmadd_pd(lo, lo, acc0);
  acc1 = _mm512_fmadd_pd(hi, hi, acc1);
}

void rms_norm_avx512(const float* x, const float* weight, float* out, int64_t n, float eps) {
  __m512d acc0 = _mm512_setzero_pd();
  __m512d acc1 = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) add_squares(_mm512_loadu_ps(x + i), acc0, acc1);
  if (i < n) add_squares(_mm512_maskz_loadu_ps(tail_mask(n - i), x + i), acc0, acc1);
  const double sum = _mm512_reduce_add_pd(_mm512_add_pd(acc0, acc1));
  const __m512 scale = _mm512_set1_ps(static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(n) + eps)));
  for (i = 0; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), scale), _mm512_loadu_ps(weight + i));
    _mm512_storeu_ps(out + i, v);
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 v =
        _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), scale), _mm512_maskz_loadu_ps(m, weight + i));
    _mm512_mask_storeu_ps(out + i, m, v);
  }
}

inline __m512 silu_mul16(__m512 g, __m512 u) {
  const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g));
  return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

void silu_mul_avx512(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i, silu_mul16(_mm512_loadu_ps(gate + i), _mm512_loadu_ps(up + i)));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(out + i, m, silu_mul16(_mm512_maskz_loadu_ps(m, gate + i), _mm512_maskz_loadu_ps(m, up + i)));
  }
}

void softmax_avx512(float* x, int64_t n) {
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(x + i));
  if (i < n) vmax = _mm512_mask_max_ps(vmax, tail_mask(n - i), vmax, _mm512_maskz_loadu_ps(tail_mask(n - i), x + i));
  const __m512 max = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
  __m512d sum0 = _mm512_setzero_pd();
  __m512d sum1 = _mm512_setzero_pd();
  for (i = 0; i + 16 <= n; i += 16) {
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), max));
    _mm512_storeu_ps(x + i, e);
    sum0 = _mm512_add_pd(sum0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    sum1 = _mm512_add_pd(sum1, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 e = _mm512_maskz_mov_ps(m, exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), max)));
    _mm512_mask_storeu_ps(x + i, m, e);
    sum0 = _mm512_add_pd(sum0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    sum1 = _mm512_add_pd(sum1, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
  }
  const __m512 inv = _mm512_set1_ps(static_cast<float>(1.0 / _mm512_reduce_add_pd(_mm512_add_pd(sum0, sum1))));
  for (i = 0; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), inv));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv));
  }
}

}  // namespace

const ElementwiseKernels& elementwise_kernels_avx512() {
  static const ElementwiseKernels kernels{rms_norm_avx512, silu_mul_avx512, softmax_avx512};
  return kernels;
}

}  // namespace kvlm::ops_internal
