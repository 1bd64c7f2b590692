// AVX-512 VNNI kernel for the super-block types (Q2_K .. Q6_K, IQ4_XS) × groups of 16 tokens
// (TokenGroupActivations: 32-element activation blocks, one token per 32-bit lane).
// Each thread stages a tile of kRows weight rows once per call (per chunk of groups), decoded
// by the register decoders of matmul_super_decode_avx2.h into one unsigned code per byte and,
// per 32-element block, f32 {scale, scale, min, min} of its two 16-element halves:
//   value = scale·u + min  (the min kinds, Q2_K / Q4_K / Q5_K: min = -dmin·mn)
//   value = scale·(u - o)  (the offset kinds, Q3_K o = 4, Q6_K o = 32; IQ4_XS as v + 128, o = 128).
// Every group then runs over the staged tile as the Q8_0 kernel does over its rows: one
// vpdpbusd takes 4 codes of one row broadcast to every lane times the same 4 quants of 16
// tokens. Against activations a = dx·q of a block:
//   Σ value·a = dx·(scale·Σ u·q + min·Σ q)   per half, Σ q over the half (TokenGroupActivations
//   sums and half_sums); an offset enters the integer dot as its start, -o·Σ q.
// Types whose sub-blocks are 32 elements (Q4_K, Q5_K, IQ4_XS) have one scale per block: one
// integer chain of 8 vpdpbusd and one float step; the 16-element ones (Q2_K, Q3_K, Q6_K) two
// chains of 4 and two float steps. Sub-block scales stay exact integers up to the f32 product
// d·k, so results differ from the row kernels' (256-element activation blocks) only by the
// finer activation scales and the f32 rounding order.
// GCC 12's AVX-512 intrinsic headers seed results with _mm*_undefined_*(), which its own
// uninitialized-use warnings flag at every call site (GCC bug 105593); the code is fine.
#if !defined(__clang__)  // clang has no -Wmaybe-uninitialized
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "ops/matmul_kernels.h"
#include "ops/matmul_super_decode_avx2.h"

namespace kvlm::ops_internal {
namespace {

constexpr int kTokens = TokenGroupActivations::kTokens;
// 12 rows: 12 independent vpdpbusd chains (see matmul_groups_avx512.cc) and 12 f32
// accumulators; the two halves of a 16-element type run one after the other, so their chains
// reuse the same registers.
constexpr int kRows = 12;
constexpr int64_t kStagedBlockBytes = 32 + 4 * sizeof(float);  // codes + {scale, scale, min, min}

// The staged form of each type: its register decoder, whether a 32-element block has two
// scales (16-element sub-blocks), the offset o of its codes (0: a min instead), and whether
// the decoded values are signed (IQ4_XS: staged as v + 128).
template <class T, bool kTwo, int kO>
struct Staged {
  using Decoder = T;
  static constexpr bool kTwoScales = kTwo;
  static constexpr int kOffset = kO;
  static constexpr bool kSignedValues = T::kKind == CodeKind::kSigned;
  static constexpr bool kMin = T::kKind == CodeKind::kUnsignedMin;
  static_assert(!kMin || kO == 0, "a min kind has no offset");
};
using StagedQ2K = Staged<SuperQ2K, true, 0>;
using StagedQ3K = Staged<SuperQ3K, true, 4>;
using StagedQ4K = Staged<SuperQ4K, false, 0>;
using StagedQ5K = Staged<SuperQ5K, false, 0>;
using StagedQ6K = Staged<SuperQ6K, true, 32>;
using StagedIq4Xs = Staged<SuperIq4Xs, false, 128>;

template <class S, int P>
void stage_values(const uint8_t* block, uint8_t* codes) {
  __m256i v0, v1;
  S::Decoder::template values<P>(block, v0, v1);
  if constexpr (S::kSignedValues) {
    v0 = _mm256_xor_si256(v0, _mm256_set1_epi8(-128));
    v1 = _mm256_xor_si256(v1, _mm256_set1_epi8(-128));
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + 64 * P), v0);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + 64 * P + 32), v1);
}

// One row of num_super super-blocks into codes [num_super · 256] and meta [num_super · 8, 4].
template <class S>
void stage_row(const uint8_t* row, int64_t num_super, uint8_t* codes, float* meta) {
  // Block j of a super-block takes scales of sub-blocks 2j, 2j+1 and their mins: from
  // (scales, mins) lanes (2j, 2j+1, 16+2j, 16+2j+1).
  const __m512i first4 = _mm512_setr_epi32(0, 1, 16, 17, 2, 3, 18, 19, 4, 5, 20, 21, 6, 7, 22, 23);
  const __m512i last4 = _mm512_add_epi32(first4, _mm512_set1_epi32(8));
  for (int64_t s = 0; s < num_super; ++s) {
    const uint8_t* block = row + s * S::Decoder::kBytes;
    uint8_t* out = codes + s * 256;
    stage_values<S, 0>(block, out);
    stage_values<S, 1>(block, out);
    stage_values<S, 2>(block, out);
    stage_values<S, 3>(block, out);
    const SuperScales sc = S::Decoder::scales(block);
    const __m512 scales = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(sc.k16)), _mm512_set1_ps(sc.d));
    __m512 mins = _mm512_setzero_ps();
    if constexpr (S::kMin) {
      mins = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(sc.mn16)), _mm512_set1_ps(-sc.dmin));
    }
    _mm512_storeu_ps(meta + s * 32, _mm512_permutex2var_ps(scales, first4, mins));
    _mm512_storeu_ps(meta + s * 32 + 16, _mm512_permutex2var_ps(scales, last4, mins));
  }
}

// Rows [r0, r0 + n) staged into a per-thread buffer of kRows rows, each num_blocks ·
// kStagedBlockBytes: codes [num_blocks, 32], then meta [num_blocks, 4]. Rows n .. kRows - 1 are
// zeros (scale and min 0), so a thread's last, partial tile runs the same kernel and its extra
// rows come out 0 and are not stored.
template <class S>
const uint8_t* stage_tile(const WeightMatrix& w, int64_t r0, int n) {
  thread_local ActivationBuffer storage;
  const int64_t num_blocks = w.cols / 32;
  const int64_t row_stride = num_blocks * kStagedBlockBytes;
  uint8_t* staged = storage.reserve(kRows * row_stride);
  for (int i = 0; i < kRows; ++i) {
    uint8_t* out = staged + i * row_stride;
    if (i >= n) {
      std::memset(out, 0, static_cast<size_t>(row_stride));
      continue;
    }
    const uint8_t* row = w.data + static_cast<uint64_t>(r0 + i) * w.row_bytes;
    stage_row<S>(row, w.cols / 256, out, reinterpret_cast<float*>(out + num_blocks * 32));
  }
  return staged;
}

inline __m512i broadcast_u32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// y for the staged tile's n rows (r0 ..) × token group g. `prefetch` (or null) is the next
// tile's first row in the matrix (rows prefetch_stride bytes apart), fetched block by block
// while this tile computes, so that staging it does not wait on memory.
template <class S>
void group_tile(const uint8_t* staged, int n, const TokenGroupActivations& xg, int64_t g, float* y, int64_t num_rows,
                int64_t r0, const uint8_t* prefetch, int64_t prefetch_stride) {
  constexpr int kHalves = S::kTwoScales ? 2 : 1;
  constexpr int kLanesPerHalf = 8 / kHalves;
  const int64_t num_blocks = xg.num_blocks;
  const int64_t row_stride = num_blocks * kStagedBlockBytes;
  const uint8_t* codes = staged;
  const uint8_t* meta = staged + num_blocks * 32;
  __m512 acc[kRows];  // lane i: token g·16 + i
#pragma GCC unroll 12
  for (int r = 0; r < kRows; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < num_blocks; ++b) {
    if (prefetch != nullptr) {
      const int64_t offset = b * prefetch_stride / num_blocks;  // block b of each next row
      for (int r = 0; r < kRows; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(prefetch + r * prefetch_stride + offset), _MM_HINT_T0);
      }
    }
    const int64_t group_block = g * num_blocks + b;
    const __m512 xd = _mm512_loadu_ps(xg.scales + group_block * kTokens);
    const __m512i sums = _mm512_loadu_si512(xg.sums + group_block * kTokens);
    __m512i half_sums[2] = {sums, sums};  // Σ q over each half (over the block for one half)
    if constexpr (S::kTwoScales) {
      half_sums[0] = _mm512_loadu_si512(xg.half_sums + group_block * kTokens);
      half_sums[1] = _mm512_sub_epi32(sums, half_sums[0]);
    }
    const int8_t* xs = xg.qs + group_block * 8 * kTokens * 4;
#pragma GCC unroll 2
    for (int h = 0; h < kHalves; ++h) {
      // The offset's share, -o·Σq, starts every row's chain (o is a power of two).
      __m512i start = _mm512_setzero_si512();
      if constexpr (S::kOffset != 0) {
        start = _mm512_sub_epi32(start, _mm512_slli_epi32(half_sums[h], __builtin_ctz(S::kOffset)));
      }
      __m512i dot[kRows];
#pragma GCC unroll 12
      for (int r = 0; r < kRows; ++r) dot[r] = start;
#pragma GCC unroll 8
      for (int lane = h * kLanesPerHalf; lane < (h + 1) * kLanesPerHalf; ++lane) {
        const __m512i xv = _mm512_loadu_si512(xs + lane * kTokens * 4);
#pragma GCC unroll 12
        for (int r = 0; r < kRows; ++r) {
          dot[r] = _mm512_dpbusd_epi32(dot[r], broadcast_u32(codes + r * row_stride + b * 32 + 4 * lane), xv);
        }
      }
      __m512 min_term = _mm512_setzero_ps();  // dx·Σq of the half (min kinds)
      if constexpr (S::kMin) min_term = _mm512_mul_ps(_mm512_cvtepi32_ps(half_sums[h]), xd);
#pragma GCC unroll 12
      for (int r = 0; r < kRows; ++r) {
        const float* m = reinterpret_cast<const float*>(meta + r * row_stride + b * 16);
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r]), _mm512_mul_ps(xd, _mm512_set1_ps(m[h])), acc[r]);
        if constexpr (S::kMin) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(m[2 + h]), min_term, acc[r]);
      }
    }
  }
  const int64_t num_valid = std::min<int64_t>(kTokens, xg.num_tokens - g * kTokens);
  for (int r = 0; r < n; ++r) {
    alignas(64) float lanes[kTokens];
    _mm512_store_ps(lanes, acc[r]);
    float* out = y + g * kTokens * num_rows + r0 + r;
    for (int64_t i = 0; i < num_valid; ++i) out[i * num_rows] = lanes[i];
  }
}

template <class S>
void token_groups(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  const WeightMatrix& w = *p.w;
  for (int64_t r0 = row_begin; r0 < row_end; r0 += kRows) {
    const int n = static_cast<int>(std::min<int64_t>(kRows, row_end - r0));
    const uint8_t* staged = stage_tile<S>(w, r0, n);
    const uint8_t* next_tile =
        r0 + 2 * kRows <= row_end ? w.data + static_cast<uint64_t>(r0 + kRows) * w.row_bytes : nullptr;
    for (int64_t g = p.group_begin; g < p.group_end; ++g) {
      group_tile<S>(staged, n, *p.xg, g, p.y, w.rows, r0, g == p.group_begin ? next_tile : nullptr,
                    static_cast<int64_t>(w.row_bytes));
    }
  }
}

}  // namespace

void matmul_super_token_groups_avx512(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  count_isa_kernel_run(Isa::kAvx512);
  count_avx512_super_group_kernel_run();
  switch (p.w->type) {
    case GgmlType::kQ2_K:
      return token_groups<StagedQ2K>(p, row_begin, row_end);
    case GgmlType::kQ3_K:
      return token_groups<StagedQ3K>(p, row_begin, row_end);
    case GgmlType::kQ4_K:
      return token_groups<StagedQ4K>(p, row_begin, row_end);
    case GgmlType::kQ5_K:
      return token_groups<StagedQ5K>(p, row_begin, row_end);
    case GgmlType::kQ6_K:
      return token_groups<StagedQ6K>(p, row_begin, row_end);
    case GgmlType::kIQ4_XS:
      return token_groups<StagedIq4Xs>(p, row_begin, row_end);
    default:
      KVLM_CHECK(false, "matmul_super_token_groups_avx512: weight type {}", ggml_type_name(p.w->type));
  }
}

}  // namespace kvlm::ops_internal
