// AVX2 + FMA kernels for rms_norm, silu_mul and softmax, with a vector exp.
#include <immintrin.h>

#include <cmath>

#include "ops/elementwise_kernels.h"

namespace kvlm::ops_internal {
namespace {

inline double hsum(__m256d v) {
  __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  s = _mm_add_sd(s, _mm_unpackhi_pd(s, s));
  return _mm_cvtsd_f64(s);
}

inline float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// 2^n for integer-valued n in [-159, 129], as two normal factors whose product rounds
// correctly to subnormals, 0 or inf.
inline __m256 pow2_mul(__m256 p, __m256 n) {
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(ni, 1);
  const __m256i rest = _mm256_sub_epi32(ni, half);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(rest, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

// exp(x) = 2^n · e^r with n = round(x·log2 e) and |r| ≤ ln2/2; e^r by its Taylor series to
// r^7 (truncation < 6e-9 relative), so the result is within a few ulp.
inline __m256 exp_ps(__m256 x) {
  // Operand order keeps NaN: max/min return the second operand when either is NaN.
  x = _mm256_min_ps(_mm256_set1_ps(89.0f), _mm256_max_ps(_mm256_set1_ps(-110.0f), x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // ln 2 split so that n · ln2_hi is exact for |n| < 512.
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860682030941723e-6f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  return pow2_mul(p, n);
}

void rms_norm_avx2(const float* x, const float* weight, float* out, int64_t n, float eps) {
  __m256d acc0 = _mm256_setzero_pd();
  __m256d acc1 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    acc0 = _mm256_fmadd_pd(lo, lo, acc0);
    acc1 = _mm256_fmadd_pd(hi, hi, acc1);
  }
  double sum = hsum(_mm256_add_pd(acc0, acc1));
  for (int64_t j = i; j < n; ++j) sum += static_cast<double>(x[j]) * x[j];
  const float s = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(n) + eps));
  const __m256 scale = _mm256_set1_ps(s);
  for (i = 0; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), scale), _mm256_loadu_ps(weight + i)));
  }
  for (; i < n; ++i) out[i] = x[i] * s * weight[i];
}

inline __m256 silu_mul8(__m256 g, __m256 u) {
  const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

void silu_mul_avx2(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, silu_mul8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  if (i < n) {  // through a padded copy: AVX2 has no masked 32-bit loads for every case we need
    alignas(32) float g[8] = {};
    alignas(32) float u[8] = {};
    alignas(32) float o[8];
    for (int64_t j = i; j < n; ++j) {
      g[j - i] = gate[j];
      u[j - i] = up[j];
    }
    _mm256_store_ps(o, silu_mul8(_mm256_load_ps(g), _mm256_load_ps(u)));
    for (int64_t j = i; j < n; ++j) out[j] = o[j - i];
  }
}

void softmax_avx2(float* x, int64_t n) {
  __m256 vmax = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + i));
  float max = hmax(vmax);
  for (int64_t j = i; j < n; ++j) max = std::fmax(max, x[j]);
  const __m256 vm = _mm256_set1_ps(max);
  __m256d sum0 = _mm256_setzero_pd();
  __m256d sum1 = _mm256_setzero_pd();
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
    _mm256_storeu_ps(x + i, e);
    sum0 = _mm256_add_pd(sum0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    sum1 = _mm256_add_pd(sum1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  double sum = hsum(_mm256_add_pd(sum0, sum1));
  if (i < n) {
    alignas(32) float t[8];
    for (int k = 0; k < 8; ++k) t[k] = i + k < n ? x[i + k] - max : -INFINITY;
    _mm256_store_ps(t, exp_ps(_mm256_load_ps(t)));
    for (int64_t j = i; j < n; ++j) {
      x[j] = t[j - i];
      sum += t[j - i];
    }
  }
  const float inv = static_cast<float>(1.0 / sum);
  const __m256 vinv = _mm256_set1_ps(inv);
  for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vinv));
  for (; i < n; ++i) x[i] *= inv;
}

}  // namespace

const ElementwiseKernels& elementwise_kernels_avx2() {
  static const ElementwiseKernels kernels{rms_norm_avx2, silu_mul_avx2, softmax_avx2};
  return kernels;
}

}  // namespace kvlm::ops_internal
