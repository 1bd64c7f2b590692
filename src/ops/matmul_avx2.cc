// AVX2 + FMA + F16C matmul kernels: register tiles of weight rows × tokens, 16 ymm registers.
#include <immintrin.h>

#include <cstring>

#include "core/check.h"
#include "ops/matmul_kernels.h"

namespace kvlm::ops_internal {
namespace {

// Weights are prefetched this many rows ahead of the tile, as on AVX-512: without it the
// hardware prefetcher left single-token decode at half the DRAM bandwidth (Sapphire Rapids).
constexpr int64_t kPrefetchRows = 8;

inline uint16_t read_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// ---- F32 / F16 / BF16: 8 columns per step; columns past the last multiple of 8 are added
// one by one after the vector sum. ----

struct F32Row {
  static constexpr int kBytes = 4;
  static __m256 load(const uint8_t* row, int64_t c) { return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + c); }
  static float at(const uint8_t* row, int64_t c) {
    float v;
    std::memcpy(&v, row + 4 * c, 4);
    return v;
  }
};

struct F16Row {
  static constexpr int kBytes = 2;
  static __m256 load(const uint8_t* row, int64_t c) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * c)));
  }
  static float at(const uint8_t* row, int64_t c) { return _cvtsh_ss(read_u16(row + 2 * c)); }
};

struct Bf16Row {
  static constexpr int kBytes = 2;
  static __m256 load(const uint8_t* row, int64_t c) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * c));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static float at(const uint8_t* row, int64_t c) { return bf16_to_fp32(read_u16(row + 2 * c)); }
};

template <class Row>
struct FloatKernel {
  static constexpr int kRows = 4;
  static constexpr int kTokens = 2;

  template <int R, int T>
  static void tile(const MatmulProblem& p, int64_t r0, int64_t t0) {
    const WeightMatrix& w = *p.w;
    const uint8_t* rows[R];
    const float* xs[T];
    for (int r = 0; r < R; ++r) rows[r] = w.data + static_cast<uint64_t>(r0 + r) * w.row_bytes;
    for (int t = 0; t < T; ++t) xs[t] = p.x + (t0 + t) * w.cols;
    __m256 acc[R][T];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
    }
    const int64_t ahead = kPrefetchRows * static_cast<int64_t>(w.row_bytes);
    int64_t c = 0;
    for (; c + 8 <= w.cols; c += 8) {
      __m256 wv[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        if (c % (64 / Row::kBytes) == 0) {  // once per cache line
          _mm_prefetch(reinterpret_cast<const char*>(rows[r] + ahead + c * Row::kBytes), _MM_HINT_T0);
        }
        wv[r] = Row::load(rows[r], c);
      }
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const __m256 xv = _mm256_loadu_ps(xs[t] + c);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
      }
    }
    for (int t = 0; t < T; ++t) {
      for (int r = 0; r < R; ++r) {
        float sum = hsum(acc[r][t]);
        for (int64_t tail = c; tail < w.cols; ++tail) sum += Row::at(rows[r], tail) * xs[t][tail];
        p.y[(t0 + t) * w.rows + r0 + r] = sum;
      }
    }
  }
};

// ---- Q8_0 / Q4_0: one block (32 weights) per step, vpmaddubsw + vpmaddwd. ----

// vpmaddubsw multiplies unsigned by signed bytes: Q8_0 takes |w| and moves w's sign onto x.
struct Q8_0Kernel {
  static constexpr int kRows = 2;
  static constexpr int kTokens = 2;

  template <int R, int T>
  static void tile(const MatmulProblem& p, int64_t r0, int64_t t0) {
    const WeightMatrix& w = *p.w;
    const QuantizedActivations& xq = *p.xq;
    const int64_t num_blocks = xq.num_blocks;
    const uint8_t* rows[R];
    const int8_t* qs[T];     // [num_blocks, 32] of token t
    const float* scales[T];  // [num_blocks]
    for (int r = 0; r < R; ++r) rows[r] = w.data + static_cast<uint64_t>(r0 + r) * w.row_bytes;
    for (int t = 0; t < T; ++t) {
      qs[t] = xq.qs + (t0 + t) * num_blocks * 32;
      scales[t] = xq.scales + (t0 + t) * num_blocks;
    }
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[R][T];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
    }
    const int64_t ahead = kPrefetchRows * static_cast<int64_t>(w.row_bytes);
    for (int64_t b = 0; b < num_blocks; ++b) {
      __m256i wq[R];
      __m256i wabs[R];
      __m256 wd[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const uint8_t* block = rows[r] + b * static_cast<int64_t>(sizeof(BlockQ8_0));
        _mm_prefetch(reinterpret_cast<const char*>(block + ahead), _MM_HINT_T0);
        wq[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2));
        wabs[r] = _mm256_abs_epi8(wq[r]);
        wd[r] = _mm256_set1_ps(_cvtsh_ss(read_u16(block)));
      }
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs[t] + b * 32));
        const __m256 xd = _mm256_broadcast_ss(scales[t] + b);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m256i pairs = _mm256_maddubs_epi16(wabs[r], _mm256_sign_epi8(xv, wq[r]));
          const __m256i dot = _mm256_madd_epi16(pairs, ones);
          acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(wd[r], xd), acc[r][t]);
        }
      }
    }
    for (int t = 0; t < T; ++t) {
      for (int r = 0; r < R; ++r) p.y[(t0 + t) * w.rows + r0 + r] = hsum(acc[r][t]);
    }
  }
};

// Q4_0 nibbles are already unsigned (value + 8); the activation bias lanes remove the 8.
// Blocks go in pairs (p.x4): one 256-bit load takes both blocks' 16 packed bytes, so one AND
// and one shift + AND give the low and the high nibbles of both, and their two vpmaddubsw sums
// (each pair of products ≤ 2·15·128) add in int16 before one vpmaddwd: lanes 0-3 hold block
// 2j, lanes 4-7 block 2j + 1, scaled by a vector of the two blocks' d_w·d_x. One token's
// decode was instruction-bound at 12 vector ops per 18-byte block (2 threads, Zen 5: 22.5-25
// GB/s against 33-42 for the AVX-512 kernel); a pair takes 17. A last odd block takes the
// single form.
struct Q4_0Kernel {
  static constexpr int kRows = 2;
  static constexpr int kTokens = 2;

  template <int R, int T>
  static void tile(const MatmulProblem& p, int64_t r0, int64_t t0) {
    const WeightMatrix& w = *p.w;
    const QuantizedActivations& xq = *p.xq;
    const Q4PairActivations& x4 = *p.x4;
    const int64_t num_blocks = xq.num_blocks;
    const uint8_t* rows[R];
    for (int r = 0; r < R; ++r) rows[r] = w.data + static_cast<uint64_t>(r0 + r) * w.row_bytes;
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i low_nibbles = _mm256_set1_epi8(0x0f);
    // [s0, s1, ..] → [s0 × 4, s1 × 4]: the pair's two scales over its two blocks' lanes.
    const __m256i pair_scale_lanes = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    __m256 acc[R][T];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
    }
    const int64_t ahead = kPrefetchRows * static_cast<int64_t>(w.row_bytes);
    constexpr int64_t kBlockBytes = sizeof(BlockQ4_0);
    for (int64_t j = 0; j < x4.num_pairs; ++j) {
      __m256i lo[R];
      __m256i hi[R];
      __m128 wd[R];  // lanes 0, 1: the two blocks' d
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const uint8_t* block = rows[r] + 2 * j * kBlockBytes;
        _mm_prefetch(reinterpret_cast<const char*>(block + ahead), _MM_HINT_T0);
        const __m256i packed = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(block + kBlockBytes + 2),
                                                   reinterpret_cast<const __m128i*>(block + 2));
        lo[r] = _mm256_and_si256(packed, low_nibbles);
        hi[r] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low_nibbles);
        wd[r] = _mm_cvtph_ps(_mm_insert_epi16(_mm_cvtsi32_si128(read_u16(block)), read_u16(block + kBlockBytes), 1));
      }
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const int64_t pair = (t0 + t) * x4.num_pairs + j;
        const int8_t* qs = x4.qs + pair * 64;
        const __m256i xlo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
        const __m256i xhi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32));
        const __m256i xb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x4.bias + pair * 8));
        const __m128 xd = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(
            xq.scales + (t0 + t) * num_blocks + 2 * j)));  // lanes 0, 1: the two blocks' d
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo[r], xlo), _mm256_maddubs_epi16(hi[r], xhi));
          const __m256i dot = _mm256_add_epi32(_mm256_madd_epi16(pairs, ones), xb);
          const __m256 scale =
              _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_mul_ps(wd[r], xd)), pair_scale_lanes);
          acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[r][t]);
        }
      }
    }
    if (num_blocks % 2 != 0) {
      const int64_t b = num_blocks - 1;
      __m256i wq[R];
      __m256 wd[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const uint8_t* block = rows[r] + b * kBlockBytes;
        const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2));
        wq[r] = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), low_nibbles);
        wd[r] = _mm256_set1_ps(_cvtsh_ss(read_u16(block)));
      }
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const int64_t idx = (t0 + t) * num_blocks + b;
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq.qs + idx * 32));
        const __m256 xd = _mm256_broadcast_ss(xq.scales + idx);
        const __m256i xb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq.bias + idx * 8));
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m256i dot = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(wq[r], xv), ones), xb);
          acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(wd[r], xd), acc[r][t]);
        }
      }
    }
    for (int t = 0; t < T; ++t) {
      for (int r = 0; r < R; ++r) p.y[(t0 + t) * w.rows + r0 + r] = hsum(acc[r][t]);
    }
  }
};

// Full R × T tiles where they fit; leftover rows and tokens run 1-wide tiles, which compute
// each element with exactly the same operations.
template <class Kernel, int R, int T>
void run_tiles(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  int64_t r = row_begin;
  for (; r + R <= row_end; r += R) {
    int64_t t = p.token_begin;
    for (; t + T <= p.token_end; t += T) Kernel::template tile<R, T>(p, r, t);
    for (; t < p.token_end; ++t) Kernel::template tile<R, 1>(p, r, t);
  }
  for (; r < row_end; ++r) {
    int64_t t = p.token_begin;
    for (; t + T <= p.token_end; t += T) Kernel::template tile<1, T>(p, r, t);
    for (; t < p.token_end; ++t) Kernel::template tile<1, 1>(p, r, t);
  }
}

// A single token streams quantized rows one at a time: one sequential stream is what the
// hardware prefetcher follows best, and there is no token to share a loaded row with.
template <class Kernel>
void run_kernel_tiles(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  if (p.token_end - p.token_begin < Kernel::kTokens) return run_tiles<Kernel, 1, 1>(p, row_begin, row_end);
  run_tiles<Kernel, Kernel::kRows, Kernel::kTokens>(p, row_begin, row_end);
}

}  // namespace

void quantize_activations_avx2(const float* x, int64_t cols, int64_t token_begin, int64_t token_end,
                               int32_t bias_offset, const QuantizedActivations& out) {
  const int64_t num_blocks = cols / 32;
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  const __m256i ones8 = _mm256_set1_epi8(1);
  const __m256i ones16 = _mm256_set1_epi16(1);
  const __m256i neg_offset = _mm256_set1_epi32(-bias_offset);
  // packs interleave 32-bit groups across the two 128-bit halves; this puts them back in order.
  const __m256i unshuffle = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t t = token_begin; t < token_end; ++t) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const float* xb = x + t * cols + b * 32;
      const int64_t block_idx = t * num_blocks + b;
      __m256 v[4];
      for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(xb + 8 * i);
      const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign_bit, v[0]), _mm256_andnot_ps(sign_bit, v[1])),
                                     _mm256_max_ps(_mm256_andnot_ps(sign_bit, v[2]), _mm256_andnot_ps(sign_bit, v[3])));
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
      const float amax = _mm_cvtss_f32(m4);
      // Same scalar formulas as the portable quantizer, so the results are bit-identical.
      const float d = amax / 127.0f;
      const float inv_d = amax != 0.0f ? 127.0f / amax : 0.0f;
      const __m256 inv = _mm256_set1_ps(inv_d);
      __m256i q32[4];
      for (int i = 0; i < 4; ++i) q32[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
      const __m256i q16a = _mm256_packs_epi32(q32[0], q32[1]);
      const __m256i q16b = _mm256_packs_epi32(q32[2], q32[3]);
      const __m256i q = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q16a, q16b), unshuffle);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.qs + block_idx * 32), q);
      out.scales[block_idx] = d;
      if (bias_offset != 0) {
        const __m256i lane_sums = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.bias + block_idx * 8),
                            _mm256_mullo_epi32(lane_sums, neg_offset));
      }
    }
  }
}

void pair_q4_activations(const QuantizedActivations& xq, int64_t token_begin, int64_t token_end,
                         const Q4PairActivations& out) {
  for (int64_t t = token_begin; t < token_end; ++t) {
    for (int64_t j = 0; j < out.num_pairs; ++j) {
      const int64_t b = t * xq.num_blocks + 2 * j;  // the pair's first block
      const int64_t pair = t * out.num_pairs + j;
      int8_t* qs = out.qs + pair * 64;
      for (int half = 0; half < 2; ++half) {  // elements 0-15, then 16-31, of both blocks
        std::memcpy(qs + 32 * half, xq.qs + b * 32 + 16 * half, 16);
        std::memcpy(qs + 32 * half + 16, xq.qs + (b + 1) * 32 + 16 * half, 16);
      }
      // int32 lane i of a block's dot sums its elements 4i..4i+3 and 16+4i..16+4i+3, which
      // xq's bias lanes i and 4 + i cancel the offset of.
      for (int k = 0; k < 2; ++k) {
        for (int i = 0; i < 4; ++i) {
          out.bias[pair * 8 + 4 * k + i] = xq.bias[(b + k) * 8 + i] + xq.bias[(b + k) * 8 + 4 + i];
        }
      }
    }
  }
}

void matmul_rows_avx2(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  count_isa_kernel_run(Isa::kAvx2);
  switch (p.w->type) {
    case GgmlType::kF32:
      return run_tiles<FloatKernel<F32Row>, FloatKernel<F32Row>::kRows, FloatKernel<F32Row>::kTokens>(p, row_begin,
                                                                                                      row_end);
    case GgmlType::kF16:
      return run_tiles<FloatKernel<F16Row>, FloatKernel<F16Row>::kRows, FloatKernel<F16Row>::kTokens>(p, row_begin,
                                                                                                      row_end);
    case GgmlType::kBF16:
      return run_tiles<FloatKernel<Bf16Row>, FloatKernel<Bf16Row>::kRows, FloatKernel<Bf16Row>::kTokens>(p, row_begin,
                                                                                                         row_end);
    case GgmlType::kQ8_0:
      return run_kernel_tiles<Q8_0Kernel>(p, row_begin, row_end);
    case GgmlType::kQ4_0:
      return run_kernel_tiles<Q4_0Kernel>(p, row_begin, row_end);
    default:
      KVLM_CHECK(false, "matmul_rows_avx2: weight type {}", ggml_type_name(p.w->type));
  }
}

}  // namespace kvlm::ops_internal
