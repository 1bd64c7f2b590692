// AVX-512 fused kernel for the super-block types (Q2_K .. Q6_K, IQ4_XS): each weight block is
// decoded into registers (matmul_super_decode_avx2.h), joined into 64-element zmm chunks that
// line up with 64 contiguous activation bytes, and dotted by vpmaddubsw + vpmaddwd with the
// four sub-block scales of the chunk; tiles of rows × tokens share each decode.
// vpmaddwd does the pair sum and the scale multiply in one instruction, which a vpdpbusd would
// need a vpmulld after (scales change every 16 elements), so VNNI buys nothing here.
// GCC 12's AVX-512 headers trip its uninitialized-use warnings (GCC bug 105593).
#if !defined(__clang__)  // clang has no -Wmaybe-uninitialized
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "core/check.h"
#include "ops/matmul_kernels.h"
#include "ops/matmul_super_decode_avx2.h"

namespace kvlm::ops_internal {
namespace {

// Batches: 2 rows × 4 tokens (8 int32 sums and 8 f32 accumulators of 32 zmm). Decode: 1 row ×
// 1 token, one sequential weight stream. Four rows had kept four streams in flight, which Q4_K
// and Q5_K needed while d and dmin went through the scalar fp16 conversion; since they convert
// with F16C, one row is faster for every type. Measured (one token, 7-11 interleaved rounds in
// one process, Zen 5, 8192 x 2048 and 2048 x 8192, 1 and 2 threads), one row's time / four
// rows': Q4_K 0.85-0.99, Q5_K 0.87-0.93, IQ4_XS 0.96-1.01; Q6_K, Q3_K and Q2_K took one row
// already (1.08-1.28x faster than four).
constexpr int kRows = 2;
constexpr int kTokens = 4;
constexpr int64_t kPrefetchRows = 8;

// The scales of 64-element chunk P: int16 lanes 8j .. 8j+7 hold k[4P + j] (vpmaddubsw's pair
// sums over elements 16j .. 16j+15).
template <int P>
inline __m512i chunk_scales(__m512i k16) {
  const __m512i idx = _mm512_setr_epi64(0x0001000100010001ll * (4 * P),
                                        0x0001000100010001ll * (4 * P),
                                        0x0001000100010001ll * (4 * P + 1), 0x0001000100010001ll * (4 * P + 1),
                                        0x0001000100010001ll * (4 * P + 2), 0x0001000100010001ll * (4 * P + 2),
                                        0x0001000100010001ll * (4 * P + 3), 0x0001000100010001ll * (4 * P + 3));
  return _mm512_permutexvar_epi16(idx, k16);
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
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) rows[r] = w.data + static_cast<uint64_t>(r0 + r) * w.row_bytes;
    const int64_t ahead = kPrefetchRows * static_cast<int64_t>(w.row_bytes);
    __m512 acc[R][T];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < num_blocks; ++b) {
      const uint8_t* blk[R];
      SuperScales sc[R];
      __m512i k16[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        blk[r] = rows[r] + b * Q::kBytes;
        for (int off = 0; off < Q::kBytes; off += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(blk[r] + ahead + off), _MM_HINT_T0);
        }
        sc[r] = Q::scales(blk[r]);
        k16[r] = _mm512_castsi256_si512(sc[r].k16);  // only lanes < 16 are ever selected
      }
      const int8_t* a[T];
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) a[t] = xk.qs + ((t0 + t) * num_blocks + b) * 256;
      __m512i sum[R][T];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) sum[r][t] = _mm512_setzero_si512();
      }
      auto chunk = [&]<int P>() {
        __m512i u[R], k[R];
        __mmask64 negative[R];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          __m256i v0, v1;
          Q::template values<P>(blk[r], v0, v1);
          const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(v0), v1, 1);
          if constexpr (Q::kKind == CodeKind::kSigned) {
            negative[r] = _mm512_movepi8_mask(v);
            u[r] = _mm512_abs_epi8(v);
          } else {
            negative[r] = 0;
            u[r] = v;
          }
          k[r] = chunk_scales<P>(k16[r]);
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
          const __m512i av = _mm512_loadu_si512(a[t] + 64 * P);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            __m512i as = av;
            if constexpr (Q::kKind == CodeKind::kSigned) {
              as = _mm512_mask_sub_epi8(av, negative[r], _mm512_setzero_si512(), av);
            }
            sum[r][t] = _mm512_add_epi32(sum[r][t], _mm512_madd_epi16(_mm512_maddubs_epi16(u[r], as), k[r]));
          }
        }
      };
      chunk.template operator()<0>();
      chunk.template operator()<1>();
      chunk.template operator()<2>();
      chunk.template operator()<3>();
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const int64_t idx = (t0 + t) * num_blocks + b;
        const float dx = xk.scales[idx];
        const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xk.bsums + idx * 16));
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          __m512i s = sum[r][t];
          if constexpr (Q::kKind == CodeKind::kUnsignedOffset) {
            s = _mm512_sub_epi32(s, _mm512_zextsi256_si512(_mm256_madd_epi16(sc[r].mn16, bsums)));
          }
          acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(sc[r].d * dx), acc[r][t]);
          if constexpr (Q::kKind == CodeKind::kUnsignedMin) {
            const __m512 mins = _mm512_cvtepi32_ps(_mm512_zextsi256_si512(_mm256_madd_epi16(sc[r].mn16, bsums)));
            acc[r][t] = _mm512_fnmadd_ps(mins, _mm512_set1_ps(sc[r].dmin * dx), acc[r][t]);
          }
        }
      }
    }
    for (int t = 0; t < T; ++t) {
      for (int r = 0; r < R; ++r) p.y[(t0 + t) * w.rows + r0 + r] = _mm512_reduce_add_ps(acc[r][t]);
    }
  }
};

// Full R × T tiles where they fit, then 1-row / 1-token tiles (the same operations per element).
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

template <class Q>
void run_super(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  if (p.token_end - p.token_begin < kTokens) {
    return run_tiles<SuperKernel<Q>, 1, 1>(p, row_begin, row_end);
  }
  run_tiles<SuperKernel<Q>, kRows, kTokens>(p, row_begin, row_end);
}

}  // namespace

void matmul_rows_super_avx512(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  count_isa_kernel_run(Isa::kAvx512);
  switch (p.w->type) {
    case GgmlType::kQ2_K:
      return run_super<SuperQ2K>(p, row_begin, row_end);
    case GgmlType::kQ3_K:
      return run_super<SuperQ3K>(p, row_begin, row_end);
    case GgmlType::kQ4_K:
      return run_super<SuperQ4K>(p, row_begin, row_end);
    case GgmlType::kQ5_K:
      return run_super<SuperQ5K>(p, row_begin, row_end);
    case GgmlType::kQ6_K:
      return run_super<SuperQ6K>(p, row_begin, row_end);
    case GgmlType::kIQ4_XS:
      return run_super<SuperIq4Xs>(p, row_begin, row_end);
    default:
      KVLM_CHECK(false, "matmul_rows_super_avx512: weight type {}", ggml_type_name(p.w->type));
  }
}

}  // namespace kvlm::ops_internal
