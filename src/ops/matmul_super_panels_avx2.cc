// AVX2 GEMM for batches of the K-quants (Q2_K .. Q6_K) on super-block activations (one f32 scale
// per 256 elements, the format of the row kernels, of the portable path and of llama.cpp's Q8_K):
// the 8-row panels of 4-bit-or-wider codes of matmul_panels_avx2.cc, but each sub-block's int16
// sums meet the rows' integer scales in the vpmaddwd that widens them, so a super-block adds up in
// int32 and pays one conversion and one or two FMAs per token, not a conversion, a multiply and two
// FMAs per 32 columns. The mins (Q2_K, Q4_K, Q5_K) or integer offsets times the scales (Q3_K, Q6_K)
// go the same way: Σ c·(Σ q) over the sub-blocks is four or eight vpmaddwd of the rows' int16 pairs
// with the token's sub-block sums. In the panels on 32-element activations that f32 tail was 12 of
// each block's ~50 multiply-port instructions per token.
//
// Per element of a row and token, over super-blocks: d_x·(d·Σ_s k_s·Σ u·q − dmin·Σ_s m_s·Σ q)
// (mins), or d_x·d·(Σ_s k_s·Σ u·q − Σ_s o·k_s·Σ q) (offsets), the sums exact in int32. Bounds: a
// vpmaddubsw pair is at most 2·u·127 (u ≤ 63), so a group of quads adds up in int16 (≤ 32004,
// Q6_K's 2 quads); one vpmaddwd with |k| ≤ 128 is then ≤ 8.2e6, and a super-block's 32 of them stay
// below 2^28. Super-blocks accumulate in order in f32, so tiles and thread splits do not change a
// result. IQ4_XS (signed grid values: two planes) stays on 32-element activations.
//
// Staged super-block of a panel (8 rows × 256 columns): for each of its 8 blocks of 32 columns, 8
// quads of 32 bytes (quad k: row 0's codes of columns 4k..4k+3, row 1's, ... row 7's) and, per
// sub-block of the block (1 of 32 columns or 2 of 16), the rows' scales k as int16 pairs (k, k);
// then the rows' d and dmin (f32 [8] each) and their mins or o·k as int16 pairs of two consecutive
// sub-blocks. Rows past the matrix are zero codes, scales and mins.
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "ops/matmul_kernels.h"
#include "ops/matmul_panel_driver_avx2.h"
#include "ops/matmul_super_decode_avx2.h"
#include "ops/transpose_avx2.h"

namespace kvlm::ops_internal {
namespace {

using avx2_panels::kPanelRows;
constexpr int kQuads = 8;   // 4-column groups of a 32-column block
constexpr int kBlocks = 8;  // 32-column blocks of a super-block
constexpr int64_t kCodeBytes = 32 * kQuads;

// A type's staged layout: Super is its register decoder (matmul_super_decode_avx2.h), kSubs its
// scales per 32 columns, kMaxCode its largest code u.
template <class SuperOf, int kSubsOf, int kMaxCodeOf, int kCodeBeginOf, int kCodeEndOf>
struct PanelType {
  using Super = SuperOf;
  static constexpr int kSubs = kSubsOf;
  static constexpr int kMaxCode = kMaxCodeOf;
  // The block's bytes [kCodeBegin, kCodeEnd) hold its codes (all that Super::values reads), in
  // 32-byte runs whose byte l serves column l of a 32-column block.
  static constexpr int kCodeBegin = kCodeBeginOf;
  static constexpr int kCodeEnd = kCodeEndOf;
  static_assert((kCodeEnd - kCodeBegin) % 32 == 0);
  static constexpr bool kMins = Super::kKind == CodeKind::kUnsignedMin;
  static constexpr int kPairs = 4 * kSubs;  // int16 pairs of mins (or o·k) per super-block
  static constexpr int64_t kBlockBytes = kCodeBytes + 32 * kSubs;
  static constexpr int64_t kDOffset = kBlocks * kBlockBytes;
  static constexpr int64_t kDminOffset = kDOffset + 32;
  static constexpr int64_t kMinsOffset = kDminOffset + 32;
  static constexpr int64_t kSuperBytes = kMinsOffset + 32 * kPairs;
};
using PanelQ2K = PanelType<SuperQ2K, 2, 3, offsetof(BlockQ2_K, qs), offsetof(BlockQ2_K, d)>;
using PanelQ3K = PanelType<SuperQ3K, 2, 7, offsetof(BlockQ3_K, hmask), offsetof(BlockQ3_K, scales)>;
using PanelQ4K = PanelType<SuperQ4K, 1, 15, offsetof(BlockQ4_K, qs), sizeof(BlockQ4_K)>;
using PanelQ5K = PanelType<SuperQ5K, 1, 31, offsetof(BlockQ5_K, qh), sizeof(BlockQ5_K)>;
using PanelQ6K = PanelType<SuperQ6K, 2, 63, offsetof(BlockQ6_K, ql), offsetof(BlockQ6_K, scales)>;

constexpr int64_t kPrefetchBytes = 512;

inline uint32_t int16_pair(int lo, int hi) {
  return static_cast<uint32_t>(static_cast<uint16_t>(lo)) | (static_cast<uint32_t>(static_cast<uint16_t>(hi)) << 16);
}

// Stages rows [r0, row_end) into num_panels panels (the rows past row_end as zeros).
template <class P>
void stage_super_panels(const WeightMatrix& w, int64_t r0, int64_t row_end, int64_t num_panels, uint8_t* out) {
  using Super = typename P::Super;
  constexpr int64_t kSuperBytes = P::kSuperBytes;
  const int64_t num_supers = w.cols / 256;
  for (int64_t panel = 0; panel < num_panels; ++panel) {
    uint8_t* panel_out = out + panel * num_supers * kSuperBytes;
    const uint8_t* src[kPanelRows];
    avx2_panels::panel_rows(w, r0, row_end, panel, src);
    for (int64_t u = 0; u < num_supers; ++u) {
      // Per row, its int16 scale pairs (k, k), one dword per scale (8 · kSubs), and its min (or
      // o·k) pairs, one dword per two scales; transposed below into one vector per dword.
      __m256i scale_pairs[P::kSubs][kPanelRows];
      __m256i min_pairs[kPanelRows];
      alignas(32) float d[kPanelRows] = {};
      alignas(32) float dmin[kPanelRows] = {};
      for (int i = 0; i < kPanelRows; ++i) {
        if (src[i] == nullptr) {
          for (int h = 0; h < P::kSubs; ++h) scale_pairs[h][i] = _mm256_setzero_si256();
          min_pairs[i] = _mm256_setzero_si256();
          continue;
        }
        const uint8_t* block = src[i] + u * Super::kBytes;
        // The hardware prefetcher alone follows 8 row streams at half the DRAM bandwidth.
        for (int64_t line = 0; line < Super::kBytes; line += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(block + kPrefetchBytes + line), _MM_HINT_T0);
        }
        const SuperScales s = Super::scales(block);
        // k16 and mn16 hold a value per 16-element sub-block; with one scale per 32 columns
        // (kSubs 1), lanes 2j and 2j + 1 are equal.
        if constexpr (P::kSubs == 1) {
          scale_pairs[0][i] = s.k16;  // dword j: (k_j, k_j)
          // (mn_2p, mn_2p+1): the low halves of dwords 2p and 2p + 1, gathered in each 128-bit
          // lane, then the lanes' two results side by side.
          const __m256i low_halves = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,  //
                                                      0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
          min_pairs[i] = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(s.mn16, low_halves), _MM_SHUFFLE(3, 1, 2, 0));
        } else {
          // (k_q, k_q) for q = 0..15: each int16 doubled (in-lane unpacks), lanes put in order.
          const __m256i lo = _mm256_unpacklo_epi16(s.k16, s.k16);  // q 0-3 | 8-11
          const __m256i hi = _mm256_unpackhi_epi16(s.k16, s.k16);  // q 4-7 | 12-15
          scale_pairs[0][i] = _mm256_permute2x128_si256(lo, hi, 0x20);
          scale_pairs[1][i] = _mm256_permute2x128_si256(lo, hi, 0x31);
          min_pairs[i] = s.mn16;  // dword p: (mn_2p, mn_2p+1)
        }
        d[i] = s.d;
        dmin[i] = s.dmin;
      }
      // The codes are transposed before they are decoded: each 32-byte run of the 8 rows'
      // code bytes goes through one 8 × 8 dword transpose into the code bytes of 8 virtual
      // blocks, virtual block m holding columns 4m..4m + 3 of every row where a block holds
      // columns 0..31 of one row. Super::values works byte by byte, so decoding virtual block m
      // gives quad m of every 32-column block, as staged. (Decoding first took 8 transposes per
      // super-block, one per 32-column block; the code bytes take 2 (Q2_K) to 6 (Q6_K).)
      alignas(32) uint8_t virtual_blocks[kQuads][P::kCodeEnd];
      for (int c = P::kCodeBegin; c < P::kCodeEnd; c += 32) {
        __m256i run[kPanelRows];
        for (int i = 0; i < kPanelRows; ++i) {
          run[i] = src[i] == nullptr
                       ? _mm256_setzero_si256()
                       : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src[i] + u * Super::kBytes + c));
        }
        transpose_8x8_dwords(run);  // run[m]: dword m (quad m) of every row
        for (int m = 0; m < kQuads; ++m) {
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(&virtual_blocks[m][c]), run[m]);
        }
      }
      for (int h = 0; h < P::kSubs; ++h) transpose_8x8_dwords(scale_pairs[h]);  // [h][k]: scale 8h + k
      transpose_8x8_dwords(min_pairs);                                          // [p]: pair p
      uint8_t* dst = panel_out + u * kSuperBytes;
      for (int m = 0; m < kQuads; ++m) {
        __m256i quads[kBlocks];  // quad m of 32-column block j
        const uint8_t* virtual_block = virtual_blocks[m];
        Super::template values<0>(virtual_block, quads[0], quads[1]);
        Super::template values<1>(virtual_block, quads[2], quads[3]);
        Super::template values<2>(virtual_block, quads[4], quads[5]);
        Super::template values<3>(virtual_block, quads[6], quads[7]);
        for (int j = 0; j < kBlocks; ++j) {
          _mm256_store_si256(reinterpret_cast<__m256i*>(dst + j * P::kBlockBytes + m * 32), quads[j]);
        }
      }
      for (int j = 0; j < kBlocks; ++j) {
        for (int h = 0; h < P::kSubs; ++h) {  // block j's scales: q = kSubs·j + h
          const int q = P::kSubs * j + h;
          _mm256_store_si256(reinterpret_cast<__m256i*>(dst + j * P::kBlockBytes + kCodeBytes + 32 * h),
                             scale_pairs[q / 8][q % 8]);
        }
      }
      std::memcpy(dst + P::kDOffset, d, 32);
      std::memcpy(dst + P::kDminOffset, dmin, 32);
      for (int p = 0; p < P::kPairs; ++p) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(dst + P::kMinsOffset + 32 * p), min_pairs[p]);
      }
    }
  }
}

// Each token's sub-block sums of xk as int16 pairs of two consecutive sub-blocks (of 32 elements
// for kSubs 1, of 16 for 2), [tokens, super-blocks, 4 · kSubs], for the vpmaddwd with the rows' min
// (or o·k) pairs. |Σ of 32 q| ≤ 4064.
template <int kSubs>
void sub_sum_pairs(const SuperBlockActivations& xk, int64_t token_begin, int64_t token_end, uint32_t* out) {
  for (int64_t t = token_begin; t < token_end; ++t) {
    for (int64_t u = 0; u < xk.num_blocks; ++u) {
      const int16_t* bsums = xk.bsums + (t * xk.num_blocks + u) * 16;
      uint32_t* dst = out + ((t - token_begin) * xk.num_blocks + u) * 4 * kSubs;
      for (int p = 0; p < 4 * kSubs; ++p) {
        dst[p] = kSubs == 2 ? int16_pair(bsums[2 * p], bsums[2 * p + 1])
                            : int16_pair(bsums[4 * p] + bsums[4 * p + 1], bsums[4 * p + 2] + bsums[4 * p + 3]);
      }
    }
  }
}

// One panel × T tokens over every super-block; y rows [r0, r0 + valid_rows) of each token.
// sum_pairs: sub_sum_pairs of the call's tokens, from token sums_begin.
template <class P, int T>
void super_panel_tile(const uint8_t* panel, const SuperBlockActivations& xk, const uint32_t* sum_pairs,
                      int64_t sums_begin, int64_t t0, float* y, int64_t y_stride, int64_t r0, int valid_rows,
                      avx2_panels::NextStagePrefetch& prefetch) {
  constexpr int kSubQuads = kQuads / P::kSubs;
  // Quads whose int16 pair sums add up before a vpmaddwd (a pair is at most 2·kMaxCode·127).
  constexpr int kSumQuads = std::min(kSubQuads, 32767 / (2 * P::kMaxCode * 127));
  static_assert(kSumQuads >= 1 && kSubQuads % kSumQuads == 0, "codes too wide for int16 pair sums");
  constexpr int kGroups = kQuads / kSumQuads;
  const int64_t num_supers = xk.num_blocks;
  const int8_t* qs[T];
  const float* scales[T];
  const uint32_t* pairs[T];
  for (int t = 0; t < T; ++t) {
    qs[t] = xk.qs + (t0 + t) * num_supers * 256;
    scales[t] = xk.scales + (t0 + t) * num_supers;
    pairs[t] = sum_pairs + (t0 + t - sums_begin) * num_supers * P::kPairs;
  }
  __m256 acc[T];
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t u = 0; u < num_supers; ++u) {
    prefetch.step();
    const uint8_t* super = panel + u * P::kSuperBytes;
    __m256i dot[T];
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) dot[t] = _mm256_setzero_si256();
    for (int j = 0; j < kBlocks; ++j) {
      const uint8_t* block = super + j * P::kBlockBytes;
#pragma GCC unroll 4
      for (int g = 0; g < kGroups; ++g) {
        const int first = g * kSumQuads;  // in sub-block first / kSubQuads
        const __m256i k =
            _mm256_load_si256(reinterpret_cast<const __m256i*>(block + kCodeBytes + 32 * (first / kSubQuads)));
        // Summed with vpaddsw, never saturating here, for the reason matmul_panels_avx2.cc gives:
        // GCC does not regroup it into a tree that spills.
        __m256i low[T];
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) low[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int q = first; q < first + kSumQuads; ++q) {
          const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(block + q * 32));
#pragma GCC unroll 4
          for (int t = 0; t < T; ++t) {
            const __m256i xb = _mm256_set1_epi32(static_cast<int32_t>(
                super_decode::load_u32(reinterpret_cast<const uint8_t*>(qs[t] + u * 256 + j * 32 + 4 * q))));
            low[t] = _mm256_adds_epi16(low[t], _mm256_maddubs_epi16(w, xb));
          }
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) dot[t] = _mm256_add_epi32(dot[t], _mm256_madd_epi16(low[t], k));
      }
    }
    const __m256 d = _mm256_load_ps(reinterpret_cast<const float*>(super + P::kDOffset));
    __m256 dmin = _mm256_setzero_ps();
    if constexpr (P::kMins) dmin = _mm256_load_ps(reinterpret_cast<const float*>(super + P::kDminOffset));
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      __m256i mins = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int p = 0; p < P::kPairs; ++p) {
        const __m256i m = _mm256_load_si256(reinterpret_cast<const __m256i*>(super + P::kMinsOffset + 32 * p));
        const __m256i s =
            _mm256_castps_si256(_mm256_broadcast_ss(reinterpret_cast<const float*>(pairs[t] + u * P::kPairs + p)));
        mins = _mm256_add_epi32(mins, _mm256_madd_epi16(m, s));
      }
      const __m256 xs = _mm256_set1_ps(scales[t][u]);
      if constexpr (P::kMins) {
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[t]), _mm256_mul_ps(d, xs), acc[t]);
        acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_mul_ps(dmin, xs), acc[t]);
      } else {
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(dot[t], mins)), _mm256_mul_ps(d, xs), acc[t]);
      }
    }
  }
  for (int t = 0; t < T; ++t) avx2_panels::store_panel_rows(acc[t], y + (t0 + t) * y_stride + r0, valid_rows);
}

template <class P>
void run_super_panels(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  constexpr int kTokens = 4;  // 16 ymm: 4 int16 sums, 4 int32 dots, weights, scales, a broadcast
  const WeightMatrix& w = *p.w;
  const SuperBlockActivations& xk = *p.xk;
  const int64_t num_supers = w.cols / 256;
  thread_local std::vector<uint32_t> sum_pairs;
  sum_pairs.resize(static_cast<size_t>((p.token_end - p.token_begin) * num_supers * P::kPairs));
  sub_sum_pairs<P::kSubs>(xk, p.token_begin, p.token_end, sum_pairs.data());
  avx2_panels::run_staged_panels<kTokens>(
      p, row_begin, row_end, num_supers * P::kSuperBytes, SuperBlockActivations::bytes_per_token(num_supers),
      num_supers,
      [&](int64_t r0, int64_t stage_end, int64_t num_panels, uint8_t* out) {
        stage_super_panels<P>(w, r0, stage_end, num_panels, out);
      },
      [&](auto tokens, const uint8_t* panel, int64_t t, int64_t panel_r0, int valid,
          avx2_panels::NextStagePrefetch& prefetch) {
        super_panel_tile<P, decltype(tokens)::value>(panel, xk, sum_pairs.data(), p.token_begin, t, p.y, w.rows,
                                                     panel_r0, valid, prefetch);
      });
}

}  // namespace

bool avx2_super_panels_support(GgmlType type) {
  switch (type) {
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      return true;
    default:
      return false;
  }
}

void matmul_super_panels_avx2(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  switch (p.w->type) {
    case GgmlType::kQ2_K:
      return run_super_panels<PanelQ2K>(p, row_begin, row_end);
    case GgmlType::kQ3_K:
      return run_super_panels<PanelQ3K>(p, row_begin, row_end);
    case GgmlType::kQ4_K:
      return run_super_panels<PanelQ4K>(p, row_begin, row_end);
    case GgmlType::kQ5_K:
      return run_super_panels<PanelQ5K>(p, row_begin, row_end);
    case GgmlType::kQ6_K:
      return run_super_panels<PanelQ6K>(p, row_begin, row_end);
    default:
      KVLM_CHECK(false, "matmul_super_panels_avx2: weight type {}", ggml_type_name(p.w->type));
  }
}

}  // namespace kvlm::ops_internal
