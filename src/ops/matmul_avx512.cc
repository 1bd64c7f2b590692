// AVX-512 matmul kernels (F/BW/VL/DQ + VNNI): register tiles of kRows weight rows × kTokens
// tokens, so each weight vector loaded is used by every token of the tile.
// GCC 12's AVX-512 intrinsic headers seed results with _mm*_undefined_*(), which its own
// uninitialized-use warnings flag at every call site (GCC bug 105593); the code is fine.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "core/check.h"
#include "ops/matmul_kernels.h"

namespace kvlm::ops_internal {
namespace {

// 4 × 4 tiles: 16 accumulators plus the tile's weight vectors and scales fit in 32 registers.
constexpr int kRows = 4;
constexpr int kTokens = 4;

inline uint16_t read_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// ---- F32 / F16 / BF16: 16 columns per step, converted in registers, FMA with f32 x. ----

struct F32Row {
  static __m512 load(const uint8_t* row, int64_t c) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + c);
  }
  static __m512 load_masked(const uint8_t* row, int64_t c, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(row) + c);
  }
};

struct F16Row {
  static __m512 load(const uint8_t* row, int64_t c) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * c)));
  }
  static __m512 load_masked(const uint8_t* row, int64_t c, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * c));
  }
};

// bf16 is the upper half of an f32: widen and shift.
struct Bf16Row {
  static __m512 widen(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
  static __m512 load(const uint8_t* row, int64_t c) {
    return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * c)));
  }
  static __m512 load_masked(const uint8_t* row, int64_t c, __mmask16 m) {
    return widen(_mm256_maskz_loadu_epi16(m, row + 2 * c));
  }
};

template <class Row>
struct FloatKernel {
  template <int R, int T>
  static void tile(const MatmulProblem& p, int64_t r0, int64_t t0) {
    const WeightMatrix& w = *p.w;
    const uint8_t* rows[R];
    const float* xs[T];
    for (int r = 0; r < R; ++r) rows[r] = w.data + static_cast<uint64_t>(r0 + r) * w.row_bytes;
    for (int t = 0; t < T; ++t) xs[t] = p.x + (t0 + t) * w.cols;
    __m512 acc[R][T];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
    }
    int64_t c = 0;
    for (; c + 16 <= w.cols; c += 16) {
      __m512 wv[R];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) wv[r] = Row::load(rows[r], c);
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) {
        const __m512 xv = _mm512_loadu_ps(xs[t] + c);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
      }
    }
    if (c < w.cols) {  // masked loads never touch the bytes past the row
      const __mmask16 m = static_cast<__mmask16>((1u << (w.cols - c)) - 1);
      __m512 wv[R];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) wv[r] = Row::load_masked(rows[r], c, m);
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) {
        const __m512 xv = _mm512_maskz_loadu_ps(m, xs[t] + c);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
      }
    }
    for (int t = 0; t < T; ++t) {
      for (int r = 0; r < R; ++r) p.y[(t0 + t) * w.rows + r0 + r] = _mm512_reduce_add_ps(acc[r][t]);
    }
  }
};

// ---- Q8_0 / Q4_0: two blocks (64 weights) per step, integer dots with vpdpbusd. ----

// [d0 ×8, d1 ×8] as f32: the scale of each int32 lane of a two-block step.
inline __m512 pair_scales(uint16_t d0, uint16_t d1) {
  const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(static_cast<short>(d0))),
                                            _mm_set1_epi16(static_cast<short>(d1)), 1);
  return _mm512_cvtph_ps(h);
}

// vpdpbusd multiplies unsigned by signed bytes: Q8_0 weights are shifted by +128
// (activation_bias_offset), which the activation bias lanes take back out.
struct Q8_0Blocks {
  static constexpr int64_t kBlockBytes = sizeof(BlockQ8_0);
  static void load_pair(const uint8_t* blocks, __m512i& q, __m512& d) {
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blocks + 2));
    const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blocks + kBlockBytes + 2));
    q = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), _mm512_set1_epi8(-128));
    d = pair_scales(read_u16(blocks), read_u16(blocks + kBlockBytes));
  }
  // The last block of an odd count, in the lower half; the upper half is zero.
  static void load_last(const uint8_t* block, __m512i& q, __m512& d) {
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2));
    q = _mm512_zextsi256_si512(_mm256_xor_si256(lo, _mm256_set1_epi8(-128)));
    d = pair_scales(read_u16(block), 0);
  }
};

// Q4_0 keeps element i in the low nibble and i+16 in the high nibble of byte i: spread
// [qs0, qs1] to [qs0, qs0, qs1, qs1] and shift the 2nd and 4th 128-bit lanes by 4.
struct Q4_0Blocks {
  static constexpr int64_t kBlockBytes = sizeof(BlockQ4_0);
  static __m512i unpack(__m512i packed) {
    const __m512i spread = _mm512_shuffle_i64x2(packed, packed, _MM_SHUFFLE(1, 1, 0, 0));
    const int64_t k4 = 0x0004000400040004;
    const __m512i shifts = _mm512_set_epi64(k4, k4, 0, 0, k4, k4, 0, 0);
    return _mm512_and_si512(_mm512_srlv_epi16(spread, shifts), _mm512_set1_epi8(0x0f));
  }
  static void load_pair(const uint8_t* blocks, __m512i& q, __m512& d) {
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks + 2));
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks + kBlockBytes + 2));
    q = unpack(_mm512_castsi256_si512(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1)));
    d = pair_scales(read_u16(blocks), read_u16(blocks + kBlockBytes));
  }
  static void load_last(const uint8_t* block, __m512i& q, __m512& d) {
    q = unpack(_mm512_zextsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2))));
    d = pair_scales(read_u16(block), 0);
  }
};

template <class Blocks>
struct QuantKernel {
  template <int R, int T>
  static void tile(const MatmulProblem& p, int64_t r0, int64_t t0) {
    const WeightMatrix& w = *p.w;
    const QuantizedActivations& xq = *p.xq;
    const int64_t num_blocks = xq.num_blocks;
    const uint8_t* rows[R];
    const int8_t* qs[T];      // [num_blocks, 32] of token t
    const float* scales[T];   // [num_blocks, 8]
    const int32_t* bias[T];   // [num_blocks, 8]
    for (int r = 0; r < R; ++r) rows[r] = w.data + static_cast<uint64_t>(r0 + r) * w.row_bytes;
    for (int t = 0; t < T; ++t) {
      qs[t] = xq.qs + (t0 + t) * num_blocks * 32;
      scales[t] = xq.scales + (t0 + t) * num_blocks * 8;
      bias[t] = xq.bias + (t0 + t) * num_blocks * 8;
    }
    __m512 acc[R][T];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
    }
    int64_t b = 0;
    for (; b + 2 <= num_blocks; b += 2) {
      __m512i wq[R];
      __m512 wd[R];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) Blocks::load_pair(rows[r] + b * Blocks::kBlockBytes, wq[r], wd[r]);
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) {
        const __m512i xv = _mm512_loadu_si512(qs[t] + b * 32);
        const __m512 xd = _mm512_loadu_ps(scales[t] + b * 8);
        const __m512i xb = _mm512_loadu_si512(bias[t] + b * 8);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          const __m512i dot = _mm512_dpbusd_epi32(xb, wq[r], xv);
          acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(wd[r], xd), acc[r][t]);
        }
      }
    }
    if (b < num_blocks) {  // odd block count: one block in the lower half, zeros above
      __m512i wq[R];
      __m512 wd[R];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) Blocks::load_last(rows[r] + b * Blocks::kBlockBytes, wq[r], wd[r]);
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) {
        const __m512i xv = _mm512_maskz_loadu_epi8(0xffffffffull, qs[t] + b * 32);
        const __m512 xd = _mm512_maskz_loadu_ps(0x00ff, scales[t] + b * 8);
        const __m512i xb = _mm512_maskz_loadu_epi32(0x00ff, bias[t] + b * 8);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          const __m512i dot = _mm512_dpbusd_epi32(xb, wq[r], xv);
          acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(wd[r], xd), acc[r][t]);
        }
      }
    }
    for (int t = 0; t < T; ++t) {
      for (int r = 0; r < R; ++r) p.y[(t0 + t) * w.rows + r0 + r] = _mm512_reduce_add_ps(acc[r][t]);
    }
  }
};

// Full tiles where they fit; leftover rows and tokens run 1-wide tiles, which compute each
// element with exactly the same operations.
template <class Kernel>
void run_tiles(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  int64_t r = row_begin;
  for (; r + kRows <= row_end; r += kRows) {
    int64_t t = p.token_begin;
    for (; t + kTokens <= p.token_end; t += kTokens) Kernel::template tile<kRows, kTokens>(p, r, t);
    for (; t < p.token_end; ++t) Kernel::template tile<kRows, 1>(p, r, t);
  }
  for (; r < row_end; ++r) {
    int64_t t = p.token_begin;
    for (; t + kTokens <= p.token_end; t += kTokens) Kernel::template tile<1, kTokens>(p, r, t);
    for (; t < p.token_end; ++t) Kernel::template tile<1, 1>(p, r, t);
  }
}

}  // namespace

void quantize_activations_avx512(const float* x, int64_t cols, int64_t token_begin, int64_t token_end,
                                 int32_t bias_offset, const QuantizedActivations& out) {
  const int64_t num_blocks = cols / 32;
  const __m256i ones = _mm256_set1_epi8(1);
  const __m256i neg_offset = _mm256_set1_epi32(-bias_offset);
  for (int64_t t = token_begin; t < token_end; ++t) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const float* xb = x + t * cols + b * 32;
      const int64_t block_idx = t * num_blocks + b;
      const __m512 v0 = _mm512_loadu_ps(xb);
      const __m512 v1 = _mm512_loadu_ps(xb + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
      // Same scalar formulas as the portable quantizer, so the results are bit-identical.
      const float d = amax / 127.0f;
      const float inv_d = amax != 0.0f ? 127.0f / amax : 0.0f;
      const __m512 inv = _mm512_set1_ps(inv_d);
      const __m128i q0 = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v0, inv)));
      const __m128i q1 = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v1, inv)));
      const __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(q0), q1, 1);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.qs + block_idx * 32), q);
      _mm256_storeu_ps(out.scales + block_idx * 8, _mm256_set1_ps(d));
      if (bias_offset != 0) {
        const __m256i lane_sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, q);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.bias + block_idx * 8),
                            _mm256_mullo_epi32(lane_sums, neg_offset));
      }
    }
  }
}

void matmul_rows_avx512(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  switch (p.w->type) {
    case GgmlType::kF32:
      return run_tiles<FloatKernel<F32Row>>(p, row_begin, row_end);
    case GgmlType::kF16:
      return run_tiles<FloatKernel<F16Row>>(p, row_begin, row_end);
    case GgmlType::kBF16:
      return run_tiles<FloatKernel<Bf16Row>>(p, row_begin, row_end);
    case GgmlType::kQ8_0:
      return run_tiles<QuantKernel<Q8_0Blocks>>(p, row_begin, row_end);
    case GgmlType::kQ4_0:
      return run_tiles<QuantKernel<Q4_0Blocks>>(p, row_begin, row_end);
    default:
      KVLM_CHECK(false, "matmul_rows_avx512: weight type {}", ggml_type_name(p.w->type));
  }
}

}  // namespace kvlm::ops_internal
