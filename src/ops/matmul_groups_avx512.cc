// AVX-512 VNNI kernel for Q8_0 / Q4_0 weights × groups of 16 tokens (TokenGroupActivations).
// Each 32-bit lane is one token. The weights are read where they lie, without staging: each
// vpdpbusd takes 4 weight bytes of one row, broadcast to all lanes and made unsigned in the
// register (Q8_0: w + 128 by one xor; Q4_0: its nibbles, stored + 8, by a mask), times the
// same 4 signed quants of 16 tokens; the offset comes out per token, offset · Σq, a vector per
// block shared by every row. So a block's integer dot is 8 instructions per row and group
// (plus 8 broadcasts and 8 xors or masks) before one convert-and-scale, and nothing is
// written but y. (A separate vpbroadcastd measured faster than vpdpbusd's embedded {1to16}
// broadcast on Zen 5.)
// GCC 12's AVX-512 intrinsic headers seed results with _mm*_undefined_*(), which its own
// uninitialized-use warnings flag at every call site (GCC bug 105593); the code is fine.
#if !defined(__clang__)  // clang has no -Wmaybe-uninitialized
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/check.h"
#include "ops/matmul_decode_avx2.h"
#include "ops/matmul_kernels.h"

namespace kvlm::ops_internal {
namespace {

constexpr int kTokens = TokenGroupActivations::kTokens;
// Register tile: kRows rows × one group of 16 tokens: kRows int32 and kRows f32 accumulators
// plus the activation vector and a broadcast weight word. kRows independent vpdpbusd chains
// hide the instruction's latency (4 cycles; 2 a cycle on Zen 5 need 8 in flight). Measured in
// a standalone loop on Zen 5 (G vpdpbusd/s on one core): 12 rows × 1 group 4.9, 8 × 1 4.1,
// 6 × 2 groups 3.7. The former 4 rows × 2 groups left a 16-token batch (one group) 4 chains.
constexpr int kRows = 12;

inline __m512i broadcast_u32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// The weight format's block: its bytes, the f16 scale at its start, and the 4 unsigned codes
// of elements [4·lane, 4·lane + 4) broadcast to every 32-bit lane, with the offset the codes
// carry (what the kernel subtracts as offset · Σq).
struct Q8_0Format {
  static constexpr int64_t kBlockBytes = sizeof(BlockQ8_0);
  static constexpr int32_t kOffset = 128;
  static __m512i codes(const uint8_t* block, int lane) {
    return _mm512_xor_si512(broadcast_u32(block + 2 + 4 * lane), _mm512_set1_epi8(-128));
  }
};

// Q4_0 rows staged as unsigned codes, one tile's rows at a time (staged_q4_0_rows): the
// block's f16 scale, then its 32 nibbles (stored + 8) one per byte in element order. Unpacking
// in the inner loop (a shift and a mask per broadcast) made Q4_0 slower than this from 32
// tokens on; staged, each broadcast is used as it is by every token group.
struct StagedQ4_0Format {
  static constexpr int64_t kBlockBytes = 34;
  static constexpr int32_t kOffset = 8;
  static __m512i codes(const uint8_t* block, int lane) { return broadcast_u32(block + 2 + 4 * lane); }
};

// Rows [r0, r0 + n) of a Q4_0 matrix in StagedQ4_0Format, in a per-thread buffer
// [n, num_blocks, 34] (row stride num_blocks · 34).
const uint8_t* staged_q4_0_rows(const WeightMatrix& w, int64_t r0, int n) {
  thread_local ActivationBuffer storage;
  const int64_t num_blocks = w.cols / 32;
  uint8_t* staged = storage.reserve(n * num_blocks * StagedQ4_0Format::kBlockBytes);
  for (int i = 0; i < n; ++i) {
    const uint8_t* row = w.data + static_cast<uint64_t>(r0 + i) * w.row_bytes;
    uint8_t* out = staged + i * num_blocks * StagedQ4_0Format::kBlockBytes;
    for (int64_t b = 0; b < num_blocks; ++b) {
      const uint8_t* block = row + b * static_cast<int64_t>(sizeof(BlockQ4_0));
      uint8_t* dst = out + b * StagedQ4_0Format::kBlockBytes;
      std::memcpy(dst, block, 2);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 2), nibbles_to_bytes(load128(block + 2)));
    }
  }
  return staged;
}

// y for rows [r0, r0 + R) × token group g.
// `prefetch` (or null) is the next tile's first row in the matrix (rows prefetch_stride bytes
// apart), fetched block by block while this tile computes so that the next one does not wait
// on memory. `rows` is the matrix itself, or for Q4_0 the tile's staged rows.
template <class F, int R>
void group_tile(const uint8_t* rows, int64_t row_bytes, const TokenGroupActivations& xg, int64_t g, float* y,
                int64_t num_rows, int64_t r0, const uint8_t* prefetch, int64_t prefetch_stride) {
  const int64_t num_blocks = xg.num_blocks;
  __m512 acc[R];  // lane i: token g·16 + i
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i minus_offset = _mm512_set1_epi32(-F::kOffset);
  for (int64_t b = 0; b < num_blocks; ++b) {
    const uint8_t* block = rows + b * F::kBlockBytes;
    if (prefetch != nullptr) {
      const int64_t offset = b * prefetch_stride / num_blocks;  // block b of each next row
      for (int r = 0; r < kRows; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(prefetch + r * prefetch_stride + offset), _MM_HINT_T0);
      }
    }
    const int64_t group_block = g * num_blocks + b;
    const __m512i correction = _mm512_mullo_epi32(_mm512_loadu_si512(xg.sums + group_block * kTokens), minus_offset);
    __m512i dot[R];
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) dot[r] = correction;
    const int8_t* xs = xg.qs + group_block * 8 * kTokens * 4;
#pragma GCC unroll 8
    for (int lane = 0; lane < 8; ++lane) {
      const __m512i xv = _mm512_loadu_si512(xs + lane * kTokens * 4);
#pragma GCC unroll 12
      for (int r = 0; r < R; ++r) dot[r] = _mm512_dpbusd_epi32(dot[r], F::codes(block + r * row_bytes, lane), xv);
    }
    const __m512 xd = _mm512_loadu_ps(xg.scales + group_block * kTokens);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(half_f16c(block + r * row_bytes)), xd);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r]), scale, acc[r]);
    }
  }
  const int64_t num_valid = std::min<int64_t>(kTokens, xg.num_tokens - g * kTokens);
  for (int r = 0; r < R; ++r) {
    alignas(64) float lanes[kTokens];
    _mm512_store_ps(lanes, acc[r]);
    float* out = y + g * kTokens * num_rows + r0 + r;
    for (int64_t i = 0; i < num_valid; ++i) out[i * num_rows] = lanes[i];
  }
}

// Every group of p over rows [r0, r0 + R); the first pass prefetches the next tile's rows.
template <class F, int R>
void tile_groups(const MatmulProblem& p, int64_t r0, const uint8_t* next_tile) {
  const WeightMatrix& w = *p.w;
  const uint8_t* rows = w.data + static_cast<uint64_t>(r0) * w.row_bytes;
  int64_t row_bytes = static_cast<int64_t>(w.row_bytes);
  if constexpr (std::is_same_v<F, StagedQ4_0Format>) {
    rows = staged_q4_0_rows(w, r0, R);
    row_bytes = w.cols / 32 * F::kBlockBytes;
  }
  for (int64_t g = p.group_begin; g < p.group_end; ++g) {
    group_tile<F, R>(rows, row_bytes, *p.xg, g, p.y, w.rows, r0, g == p.group_begin ? next_tile : nullptr,
                     static_cast<int64_t>(w.row_bytes));
  }
}

// A tile of n < kRows rows (a thread's last) takes the kernel of its own height, so it keeps
// as many independent chains as it has rows.
template <class F, int R = kRows - 1>
void partial_tile_groups(int n, const MatmulProblem& p, int64_t r0) {
  if constexpr (R >= 1) {
    if (n == R) return tile_groups<F, R>(p, r0, nullptr);
    partial_tile_groups<F, R - 1>(n, p, r0);
  }
}

template <class F>
void token_groups(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  const WeightMatrix& w = *p.w;
  for (int64_t r0 = row_begin; r0 < row_end; r0 += kRows) {
    const int n = static_cast<int>(std::min<int64_t>(kRows, row_end - r0));
    if (n < kRows) {
      partial_tile_groups<F>(n, p, r0);
      continue;
    }
    const uint8_t* next_tile =
        r0 + 2 * kRows <= row_end ? w.data + static_cast<uint64_t>(r0 + kRows) * w.row_bytes : nullptr;
    tile_groups<F, kRows>(p, r0, next_tile);
  }
}

}  // namespace

void matmul_token_groups_avx512(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  count_isa_kernel_run(Isa::kAvx512);
  const GgmlType type = p.w->type;
  KVLM_CHECK(type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0, "matmul_token_groups_avx512: weight type {}",
             ggml_type_name(type));
  if (type == GgmlType::kQ8_0) {
    token_groups<Q8_0Format>(p, row_begin, row_end);
  } else {
    token_groups<StagedQ4_0Format>(p, row_begin, row_end);
  }
}

}  // namespace kvlm::ops_internal
