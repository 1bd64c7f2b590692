// AVX2 fused kernel for the super-block types (Q2_K .. Q6_K, IQ4_XS): each weight block is
// decoded into registers (matmul_super_decode_avx2.h) and dotted with int8 activations by
// vpmaddubsw, then vpmaddwd by the sub-block scales, in register tiles of rows × tokens so
// one decode serves every token of the tile.
#include <immintrin.h>

#include <cstring>

#include "core/check.h"
#include "ops/matmul_kernels.h"
#include "ops/matmul_super_decode_avx2.h"

namespace kvlm::ops_internal {
namespace {

// 1 row × 2 tokens. Two rows' codes, scales and sums did not fit in 16 ymm: the 2 × 2 tile
// spilled to the stack on every chunk, and measured against it (Zen 5 with KVLM_CPU=avx2,
// interleaved) one row at a time decodes a token 1.4-2.6x faster (8192 x 2048, one thread: Q4_K
// 1037 -> 514 us, Q6_K 1921 -> 734, IQ4_XS 1439 -> 1043) and 2-4 tokens run 1.24x faster.
constexpr int kRows = 1;
constexpr int kTokens = 2;
// Weights are prefetched this many rows ahead (as matmul_avx512.cc does for Q4_0 / Q8_0).
constexpr int64_t kPrefetchRows = 8;

inline float hsum_ps(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// A block's 16 sub-block scales (int16) rearranged once per block: the even sub-blocks' in the
// low 128 bits, the odd ones' in the high, so that each chunk's scales take one vpshufb.
inline __m256i split_even_odd_scales(__m256i k16) {
  // Per 128-bit lane: k[0], k[2], k[4], k[6], then k[1], k[3], k[5], k[7] (of the lane's 8).
  const __m256i even_odd = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,  //
                                            0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
  const __m256i lanes = _mm256_shuffle_epi8(k16, even_odd);
  return _mm256_permute4x64_epi64(lanes, _MM_SHUFFLE(3, 1, 2, 0));
}

// The scales of 32-element chunk c (sub-blocks 2c, 2c+1): k[2c] in int16 lanes 0-7, k[2c+1]
// in 8-15, matching vpmaddubsw's pair sums over elements 0-15 and 16-31. One vpshufb, where a
// vpermd + vpshufb per chunk cost a K-quant block 8 more ops.
inline __m256i chunk_scales(__m256i split_k16, int c) {
  return _mm256_shuffle_epi8(split_k16, _mm256_set1_epi16(static_cast<int16_t>(((2 * c + 1) << 8) | (2 * c))));
}

// Σ k·v·a over one chunk, as 8 int32 lanes.
template <CodeKind kKind>
inline __m256i chunk_dot(__m256i v, __m256i a, __m256i k) {
  if constexpr (kKind == CodeKind::kSigned) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(v), _mm256_sign_epi8(a, v)), k);
  } else {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(v, a), k);
  }
}

template <class Q>
struct SuperKernel {
  // y for rows [r0, r0 + R) × tokens [t0, t0 + T). Every (row, token) runs the same operations
  // whatever R and T are, so tile shapes never change a result.
  template <int R, int T>
  static void tile(const MatmulProblem& p, int64_t r0, int64_t t0) {
    const WeightMatrix& w = *p.w;
    const SuperBlockActivations& xk = *p.xk;
    const int64_t num_blocks = xk.num_blocks;
    const uint8_t* rows[R];
    for (int r = 0; r < R; ++r) rows[r] = w.data + static_cast<uint64_t>(r0 + r) * w.row_bytes;
    const int64_t ahead = kPrefetchRows * static_cast<int64_t>(w.row_bytes);
    __m256 acc[R][T];
    for (int r = 0; r < R; ++r) {
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < num_blocks; ++b) {
      const uint8_t* blk[R];
      SuperScales sc[R];
      for (int r = 0; r < R; ++r) {
        blk[r] = rows[r] + b * Q::kBytes;
        for (int off = 0; off < Q::kBytes; off += 64) _mm_prefetch(reinterpret_cast<const char*>(blk[r] + ahead + off), _MM_HINT_T0);
        sc[r] = Q::scales(blk[r]);
        sc[r].k16 = split_even_odd_scales(sc[r].k16);  // only chunk_scales reads k16 below
      }
      const int8_t* a[T];
      for (int t = 0; t < T; ++t) a[t] = xk.qs + ((t0 + t) * num_blocks + b) * 256;
      __m256i sum[R][T];
      for (int r = 0; r < R; ++r) {
        for (int t = 0; t < T; ++t) sum[r][t] = _mm256_setzero_si256();
      }
      auto pair = [&]<int P>() {
        __m256i v0[R], v1[R], k0[R], k1[R];
        for (int r = 0; r < R; ++r) {
          Q::template values<P>(blk[r], v0[r], v1[r]);
          k0[r] = chunk_scales(sc[r].k16, 2 * P);
          k1[r] = chunk_scales(sc[r].k16, 2 * P + 1);
        }
        for (int t = 0; t < T; ++t) {
          const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[t] + 64 * P));
          const __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[t] + 64 * P + 32));
          for (int r = 0; r < R; ++r) {
            sum[r][t] = _mm256_add_epi32(sum[r][t], _mm256_add_epi32(chunk_dot<Q::kKind>(v0[r], a0, k0[r]),
                                                                     chunk_dot<Q::kKind>(v1[r], a1, k1[r])));
          }
        }
      };
      pair.template operator()<0>();
      pair.template operator()<1>();
      pair.template operator()<2>();
      pair.template operator()<3>();
      for (int t = 0; t < T; ++t) {
        const int64_t idx = (t0 + t) * num_blocks + b;
        const float dx = xk.scales[idx];
        const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xk.bsums + idx * 16));
        for (int r = 0; r < R; ++r) {
          __m256i s = sum[r][t];
          if constexpr (Q::kKind == CodeKind::kUnsignedOffset) s = _mm256_sub_epi32(s, _mm256_madd_epi16(sc[r].mn16, bsums));
          acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(sc[r].d * dx), acc[r][t]);
          if constexpr (Q::kKind == CodeKind::kUnsignedMin) {
            const __m256 mins = _mm256_cvtepi32_ps(_mm256_madd_epi16(sc[r].mn16, bsums));
            acc[r][t] = _mm256_fnmadd_ps(mins, _mm256_set1_ps(sc[r].dmin * dx), acc[r][t]);
          }
        }
      }
    }
    for (int t = 0; t < T; ++t) {
      for (int r = 0; r < R; ++r) p.y[(t0 + t) * w.rows + r0 + r] = hsum_ps(acc[r][t]);
    }
  }
};

// One row at a time (kRows): tokens in tiles of kTokens, then one by one (the same operations
// per element).
template <class Kernel>
void run_tiles(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  static_assert(kRows == 1, "rows beyond a tile's would need their own loop");
  for (int64_t r = row_begin; r < row_end; ++r) {
    int64_t t = p.token_begin;
    for (; t + kTokens <= p.token_end; t += kTokens) Kernel::template tile<kRows, kTokens>(p, r, t);
    for (; t < p.token_end; ++t) Kernel::template tile<kRows, 1>(p, r, t);
  }
}

}  // namespace

void matmul_rows_super_avx2(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  count_isa_kernel_run(Isa::kAvx2);
  switch (p.w->type) {
    case GgmlType::kQ2_K:
      return run_tiles<SuperKernel<SuperQ2K>>(p, row_begin, row_end);
    case GgmlType::kQ3_K:
      return run_tiles<SuperKernel<SuperQ3K>>(p, row_begin, row_end);
    case GgmlType::kQ4_K:
      return run_tiles<SuperKernel<SuperQ4K>>(p, row_begin, row_end);
    case GgmlType::kQ5_K:
      return run_tiles<SuperKernel<SuperQ5K>>(p, row_begin, row_end);
    case GgmlType::kQ6_K:
      return run_tiles<SuperKernel<SuperQ6K>>(p, row_begin, row_end);
    case GgmlType::kIQ4_XS:
      return run_tiles<SuperKernel<SuperIq4Xs>>(p, row_begin, row_end);
    default:
      KVLM_CHECK(false, "matmul_rows_super_avx2: weight type {}", ggml_type_name(p.w->type));
  }
}

void quantize_superblock_activations_avx2(const float* x, int64_t cols, int64_t token_begin, int64_t token_end,
                                          const SuperBlockActivations& out, const uint8_t* run_order) {
  const int64_t num_blocks = cols / 256;
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  const __m256i ones8 = _mm256_set1_epi8(1);
  const __m256i ones16 = _mm256_set1_epi16(1);
  // packs interleave 32-bit groups across the two 128-bit halves; this puts them back in order.
  const __m256i unshuffle = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t t = token_begin; t < token_end; ++t) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const float* xb = x + t * cols + b * 256;
      const int64_t idx = t * num_blocks + b;
      __m256 m = _mm256_setzero_ps();
      for (int i = 0; i < 32; ++i) m = _mm256_max_ps(m, _mm256_andnot_ps(sign_bit, _mm256_loadu_ps(xb + 8 * i)));
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
      const float amax = _mm_cvtss_f32(m4);
      // The portable quantizer's scalar formulas, and vcvtps2dq rounds to nearest even as its
      // magic-number addition does (|q| ≤ 127), so the results are bit-identical.
      const float inv_d = amax != 0.0f ? 127.0f / amax : 0.0f;
      const __m256 inv = _mm256_set1_ps(inv_d);
      alignas(32) int8_t q[256];
      alignas(32) int32_t quad_sums[64];  // Σ of each 4 consecutive q
      for (int g = 0; g < 8; ++g) {
        __m256i q32[4];
        for (int i = 0; i < 4; ++i) q32[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 32 * g + 8 * i), inv));
        const __m256i q16a = _mm256_packs_epi32(q32[0], q32[1]);
        const __m256i q16b = _mm256_packs_epi32(q32[2], q32[3]);
        const __m256i q8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q16a, q16b), unshuffle);
        _mm256_store_si256(reinterpret_cast<__m256i*>(q + 32 * g), q8);
        _mm256_store_si256(reinterpret_cast<__m256i*>(quad_sums + 8 * g),
                           _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q8), ones16));
      }
      out.scales[idx] = amax / 127.0f;
      for (int s = 0; s < 16; ++s) {
        const int32_t* quads = quad_sums + 4 * s;
        out.bsums[idx * 16 + s] = static_cast<int16_t>(quads[0] + quads[1] + quads[2] + quads[3]);
      }
      int8_t* stored = out.qs + idx * 256;
      if (run_order == nullptr) {
        std::memcpy(stored, q, 256);
      } else {
        for (int r = 0; r < 16; ++r) std::memcpy(stored + 16 * r, q + 16 * run_order[r], 16);
      }
    }
  }
}

}  // namespace kvlm::ops_internal
