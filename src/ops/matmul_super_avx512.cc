// AVX-512 fused kernel for the super-block types (Q2_K .. Q6_K, IQ4_XS): each weight block is
// unpacked into registers a whole zmm at a time, in the type's own element order (below), and
// dotted by vpmaddubsw + vpdpwssd with the four sub-block scales of each 64-code chunk; tiles of
// rows × tokens share each unpack.
// Element order: one 512-bit load of packed codes unpacks into whole chunks with no cross-lane
// shuffle when the activations come in the order the packing puts the codes in (Q4_K's first
// 64 code bytes hold elements 0-31 and 64-95 in their low nibbles), so matmul() stores the
// activations in that order (avx512_super_activation_order). Joining 256-bit halves in element
// order cost an insert per chunk, and the unpack took twice the instructions.
// vpmaddubsw's int16 pair sums meet the scales in vpdpwssd, which multiplies, pairs and adds in
// one instruction; a vpdpbusd would need a vpmulld after (scales change every 16 elements).
// GCC 12's AVX-512 headers trip its uninitialized-use warnings (GCC bug 105593).
#if !defined(__clang__)  // clang has no -Wmaybe-uninitialized
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "core/check.h"
#include "ops/matmul_kernels.h"
#include "ops/matmul_super_decode_avx2.h"
#include "ops/matmul_super_scales_avx512.h"

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

namespace zmm {

inline __m512i load512(const uint8_t* p) { return _mm512_loadu_si512(p); }
inline __m512i broadcast256(const uint8_t* p) {
  return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Nibble H (0: low, 1: high) of every byte.
template <int H>
inline __m512i nibbles(__m512i q) {
  const __m512i m4 = _mm512_set1_epi8(15);
  if constexpr (H == 0) return _mm512_and_si512(q, m4);
  return _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
}

// Bits kFrom0 .. kFrom0 + kWidth - 1 of every byte of the low 256 bits, and kFrom1 .. of the
// high 256 bits, moved to bits kTo .. kTo + kWidth - 1 (all others cleared). A 32-bit rotate
// never carries a bit of a neighbouring byte into the kept ones: a left rotate by s brings in
// bits 0 .. s-1 only (s ≤ kTo), a right rotate by s bits 8-s .. 7 only (8-s ≥ kTo + kWidth
// because kFrom + kWidth ≤ 8).
template <int kFrom0, int kFrom1, int kTo, int kWidth>
inline __m512i move_bits(__m512i x) {
  static_assert(kFrom0 + kWidth <= 8 && kFrom1 + kWidth <= 8 && kTo + kWidth <= 8);
  constexpr int r0 = (kTo - kFrom0) & 31, r1 = (kTo - kFrom1) & 31;
  const __m512i counts = _mm512_setr_epi32(r0, r0, r0, r0, r0, r0, r0, r0, r1, r1, r1, r1, r1, r1, r1, r1);
  const __m512i mask = _mm512_set1_epi8(static_cast<char>(((1 << kWidth) - 1) << kTo));
  return _mm512_and_si512(_mm512_rolv_epi32(x, counts), mask);
}

}  // namespace zmm

// Each type's codes in zmm order: chunk C (< 4) of a block holds 64 codes, one per byte, and
// position p of it is element element(C, p) of the block's 256. Scales, mins and code kinds come
// from the register decoders of matmul_super_decode_avx2.h, scales in vector registers where
// matmul_super_scales_avx512.h has them.
struct ZmmQ2K : SuperQ2K {  // element 128h + 32j + l: bits 2j, 2j+1 of qs[32h + l]
  static constexpr int element(int c, int p) { return 128 * (p / 32) + 32 * c + p % 32; }
  template <int C>
  static __m512i codes(const uint8_t* b) {
    return _mm512_and_si512(_mm512_srli_epi16(zmm::load512(b + 16), 2 * C), _mm512_set1_epi8(3));
  }
};

struct ZmmQ3K : SuperQ3KVectorScales {  // as Q2_K, high bit 4h + j of hmask[l]
  static constexpr int element(int c, int p) { return ZmmQ2K::element(c, p); }
  template <int C>
  static __m512i codes(const uint8_t* b) {
    const __m512i low = _mm512_and_si512(_mm512_srli_epi16(zmm::load512(b + 32), 2 * C), _mm512_set1_epi8(3));
    return _mm512_or_si512(low, zmm::move_bits<C, 4 + C, 2, 1>(zmm::broadcast256(b)));
  }
};

struct ZmmQ4K : SuperQ4KVectorScales {  // 64 code bytes: low nibbles elements 0-31, 64-95; high 32-63, 96-127
  static constexpr int element(int c, int p) { return 128 * (c / 2) + 64 * (p / 32) + 32 * (c % 2) + p % 32; }
  template <int C>
  static __m512i codes(const uint8_t* b) {
    return zmm::nibbles<C % 2>(zmm::load512(b + 16 + 64 * (C / 2)));
  }
};

struct ZmmQ5K : SuperQ5KVectorScales {  // as Q4_K, bit 4 from qh: bit 2P (low nibbles of 64P..) or 2P+1
  static constexpr int element(int c, int p) { return ZmmQ4K::element(c, p); }
  template <int C>
  static __m512i codes(const uint8_t* b) {
    constexpr int from0 = 4 * (C / 2) + C % 2;
    const __m512i low = zmm::nibbles<C % 2>(zmm::load512(b + 48 + 64 * (C / 2)));
    return _mm512_or_si512(low, zmm::move_bits<from0, from0 + 2, 4, 1>(zmm::broadcast256(b + 16)));
  }
};

struct ZmmQ6K : SuperQ6K {  // element order: ql's 64 bytes of a half give its elements in order
  static constexpr int element(int c, int p) { return 64 * c + p; }
  template <int C>
  static __m512i codes(const uint8_t* b) {
    constexpr int h = C / 2, i0 = 2 * (C % 2);  // 32-element runs i0, i0 + 1 of half h
    const __m512i low = zmm::nibbles<C % 2>(zmm::load512(b + 64 * h));
    return _mm512_or_si512(low, zmm::move_bits<2 * i0, 2 * i0 + 2, 4, 2>(zmm::broadcast256(b + 128 + 32 * h)));
  }
};

struct ZmmIq4Xs : SuperIq4XsVectorScales {  // 128-bit lane m of 64 code bytes is sub-block 4(C/2) + m
  static constexpr int element(int c, int p) { return 32 * (4 * (c / 2) + p / 16) + 16 * (c % 2) + p % 16; }
  template <int C>
  static __m512i codes(const uint8_t* b) {
    const __m512i grid = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4Values)));
    return _mm512_shuffle_epi8(grid, zmm::nibbles<C % 2>(zmm::load512(b + 8 + 64 * (C / 2))));
  }
};

// Z's element order as runs: positions 16r .. 16r+15 of a chunked block hold elements
// 16·runs[r] .. 16·runs[r] + 15, checked to hold for every position and to be a permutation.
// (Each 16 positions are one scale lane of vpmaddubsw's pair sums, so a run must lie in one
// 16-element sub-block; in every type it is a whole one, which lets the quantizer copy runs.)
template <class Z>
struct ElementOrder {
  uint8_t runs[16] = {};
  bool natural = true;
  constexpr ElementOrder() {
    bool seen[16] = {};
    for (int c = 0; c < 4; ++c) {
      for (int p = 0; p < 64; ++p) {
        const int run = 4 * c + p / 16;
        const int e = Z::element(c, p);
        if (p % 16 == 0) {
          if (e % 16 != 0 || seen[e / 16]) throw "element order is not a permutation of 16-element runs";
          runs[run] = static_cast<uint8_t>(e / 16);
          seen[e / 16] = true;
          natural = natural && e / 16 == run;
        }
        if (e != 16 * runs[run] + p % 16) throw "a 16-position run is not one 16-element sub-block";
      }
    }
  }
};
template <class Z>
inline constexpr ElementOrder<Z> kElementOrder{};

// vpermw indices giving chunk C's scales: int16 lane k of vpmaddubsw's pair sums covers
// positions 2k, 2k+1, which lie in the 16-element sub-block element(C, 16(k / 8)) / 16.
template <class Z>
struct ChunkScaleIndex {
  alignas(64) int16_t lanes[4][32] = {};
  constexpr ChunkScaleIndex() {
    for (int c = 0; c < 4; ++c) {
      for (int k = 0; k < 32; ++k) lanes[c][k] = static_cast<int16_t>(Z::element(c, 16 * (k / 8)) / 16);
    }
  }
};
template <class Z>
inline constexpr ChunkScaleIndex<Z> kChunkScaleIndex{};

template <class Z>
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
        blk[r] = rows[r] + b * Z::kBytes;
        for (int off = 0; off < Z::kBytes; off += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(blk[r] + ahead + off), _MM_HINT_T0);
        }
        sc[r] = Z::scales(blk[r]);
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
      auto chunk = [&]<int C>() {
        const __m512i scale_index = _mm512_load_si512(kChunkScaleIndex<Z>.lanes[C]);
        __m512i u[R], k[R];
        __mmask64 negative[R];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m512i v = Z::template codes<C>(blk[r]);
          if constexpr (Z::kKind == CodeKind::kSigned) {
            negative[r] = _mm512_movepi8_mask(v);
            u[r] = _mm512_abs_epi8(v);
          } else {
            negative[r] = 0;
            u[r] = v;
          }
          k[r] = _mm512_permutexvar_epi16(scale_index, k16[r]);
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
          const __m512i av = _mm512_loadu_si512(a[t] + 64 * C);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            __m512i as = av;
            if constexpr (Z::kKind == CodeKind::kSigned) {
              as = _mm512_mask_sub_epi8(av, negative[r], _mm512_setzero_si512(), av);
            }
            sum[r][t] = _mm512_dpwssd_epi32(sum[r][t], _mm512_maddubs_epi16(u[r], as), k[r]);
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
          if constexpr (Z::kKind == CodeKind::kUnsignedOffset) {
            s = _mm512_sub_epi32(s, _mm512_zextsi256_si512(_mm256_madd_epi16(sc[r].mn16, bsums)));
          }
          acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(sc[r].d * dx), acc[r][t]);
          if constexpr (Z::kKind == CodeKind::kUnsignedMin) {
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

template <class Z>
void run_super(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  if (p.token_end - p.token_begin < kTokens) {
    return run_tiles<SuperKernel<Z>, 1, 1>(p, row_begin, row_end);
  }
  run_tiles<SuperKernel<Z>, kRows, kTokens>(p, row_begin, row_end);
}

}  // namespace

void matmul_rows_super_avx512(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  count_isa_kernel_run(Isa::kAvx512);
  switch (p.w->type) {
    case GgmlType::kQ2_K:
      return run_super<ZmmQ2K>(p, row_begin, row_end);
    case GgmlType::kQ3_K:
      return run_super<ZmmQ3K>(p, row_begin, row_end);
    case GgmlType::kQ4_K:
      return run_super<ZmmQ4K>(p, row_begin, row_end);
    case GgmlType::kQ5_K:
      return run_super<ZmmQ5K>(p, row_begin, row_end);
    case GgmlType::kQ6_K:
      return run_super<ZmmQ6K>(p, row_begin, row_end);
    case GgmlType::kIQ4_XS:
      return run_super<ZmmIq4Xs>(p, row_begin, row_end);
    default:
      KVLM_CHECK(false, "matmul_rows_super_avx512: weight type {}", ggml_type_name(p.w->type));
  }
}

const uint8_t* avx512_super_activation_order(GgmlType type) {
  auto order = []<class Z>(Z*) -> const uint8_t* { return kElementOrder<Z>.natural ? nullptr : kElementOrder<Z>.runs; };
  switch (type) {
    case GgmlType::kQ2_K:
      return order(static_cast<ZmmQ2K*>(nullptr));
    case GgmlType::kQ3_K:
      return order(static_cast<ZmmQ3K*>(nullptr));
    case GgmlType::kQ4_K:
      return order(static_cast<ZmmQ4K*>(nullptr));
    case GgmlType::kQ5_K:
      return order(static_cast<ZmmQ5K*>(nullptr));
    case GgmlType::kQ6_K:
      return order(static_cast<ZmmQ6K*>(nullptr));
    case GgmlType::kIQ4_XS:
      return order(static_cast<ZmmIq4Xs*>(nullptr));
    default:
      return nullptr;
  }
}

}  // namespace kvlm::ops_internal
