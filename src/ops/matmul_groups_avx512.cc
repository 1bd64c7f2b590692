// AVX-512 VNNI kernel for Q8_0 / Q4_0 weights × groups of 16 tokens (TokenGroupActivations):
// each 32-bit lane is one token, each weight row's 4-byte groups are broadcast, so a block's
// integer dot completes in 8 vpdpbusd before one convert-and-scale. About twice the
// throughput of the per-token kernel, where every vpdpbusd needs its own scaling.
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

constexpr int kTokens = TokenGroupActivations::kTokens;
// 4 rows × 2 groups: 8 float and 8 int32 accumulators, the activation vectors of one
// 4-element step, and the broadcast weights fit in 32 registers.
constexpr int kRows = 4;
constexpr int kGroups = 2;

inline __m512i broadcast_u32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

inline float block_scale(const uint8_t* block) {
  uint16_t d;
  std::memcpy(&d, block, 2);
  return _cvtsh_ss(d);
}

// Adds block b of each row times each group's activations into dot[r][g].
// Q8_0 bytes are shifted by +128 for vpdpbusd's unsigned operand; the bias takes it back.
struct Q8_0Weights {
  static constexpr int64_t kBlockBytes = sizeof(BlockQ8_0);

  template <int R, int G>
  static void accumulate(const uint8_t* const* rows, int64_t b, const int8_t* const* xs, __m512i (&dot)[R][G]) {
    const __m512i flip = _mm512_set1_epi8(-128);
#pragma GCC unroll 8
    for (int lane = 0; lane < 8; ++lane) {
      __m512i xv[G];
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) xv[g] = _mm512_loadu_si512(xs[g] + lane * kTokens * 4);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512i wv = _mm512_xor_si512(broadcast_u32(rows[r] + b * kBlockBytes + 2 + lane * 4), flip);
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) dot[r][g] = _mm512_dpbusd_epi32(dot[r][g], wv, xv[g]);
      }
    }
  }
};

// Q4_0 byte i holds element i (low nibble) and i+16 (high nibble): one broadcast serves
// lane k (elements 4k..4k+3) and lane k+4 (elements 16+4k..).
struct Q4_0Weights {
  static constexpr int64_t kBlockBytes = sizeof(BlockQ4_0);

  template <int R, int G>
  static void accumulate(const uint8_t* const* rows, int64_t b, const int8_t* const* xs, __m512i (&dot)[R][G]) {
    const __m512i low_nibbles = _mm512_set1_epi8(0x0f);
#pragma GCC unroll 4
    for (int lane = 0; lane < 4; ++lane) {
      __m512i xlo[G];
      __m512i xhi[G];
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) {
        xlo[g] = _mm512_loadu_si512(xs[g] + lane * kTokens * 4);
        xhi[g] = _mm512_loadu_si512(xs[g] + (lane + 4) * kTokens * 4);
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512i packed = broadcast_u32(rows[r] + b * kBlockBytes + 2 + lane * 4);
        const __m512i lo = _mm512_and_si512(packed, low_nibbles);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low_nibbles);
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) {
          dot[r][g] = _mm512_dpbusd_epi32(dot[r][g], lo, xlo[g]);
          dot[r][g] = _mm512_dpbusd_epi32(dot[r][g], hi, xhi[g]);
        }
      }
    }
  }
};

template <class Weights, int R, int G>
void group_tile(const MatmulProblem& p, int64_t r0, int64_t g0) {
  const WeightMatrix& w = *p.w;
  const TokenGroupActivations& xg = *p.xg;
  const int64_t num_blocks = xg.num_blocks;
  const uint8_t* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = w.data + static_cast<uint64_t>(r0 + r) * w.row_bytes;
  __m512 acc[R][G];  // lane i: token (g0 + g)·16 + i
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) acc[r][g] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int8_t* xs[G];
    __m512i dot[R][G];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const int64_t group_block = (g0 + g) * num_blocks + b;
      xs[g] = xg.qs + group_block * 8 * kTokens * 4;
      const __m512i bias = _mm512_loadu_si512(xg.bias + group_block * kTokens);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) dot[r][g] = bias;
    }
    Weights::template accumulate<R, G>(rows, b, xs, dot);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const __m512 xd = _mm512_loadu_ps(xg.scales + ((g0 + g) * num_blocks + b) * kTokens);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(block_scale(rows[r] + b * Weights::kBlockBytes)), xd);
        acc[r][g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r][g]), scale, acc[r][g]);
      }
    }
  }
  for (int g = 0; g < G; ++g) {
    for (int r = 0; r < R; ++r) {
      alignas(64) float lanes[kTokens];
      _mm512_store_ps(lanes, acc[r][g]);
      float* y = p.y + (g0 + g) * kTokens * w.rows + r0 + r;
      for (int i = 0; i < kTokens; ++i) y[i * w.rows] = lanes[i];
    }
  }
}

template <class Weights>
void run_group_tiles(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  int64_t r = row_begin;
  for (; r + kRows <= row_end; r += kRows) {
    int64_t g = p.group_begin;
    for (; g + kGroups <= p.group_end; g += kGroups) group_tile<Weights, kRows, kGroups>(p, r, g);
    for (; g < p.group_end; ++g) group_tile<Weights, kRows, 1>(p, r, g);
  }
  for (; r < row_end; ++r) {
    int64_t g = p.group_begin;
    for (; g + kGroups <= p.group_end; g += kGroups) group_tile<Weights, 1, kGroups>(p, r, g);
    for (; g < p.group_end; ++g) group_tile<Weights, 1, 1>(p, r, g);
  }
}

}  // namespace

void matmul_token_groups_avx512(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  switch (p.w->type) {
    case GgmlType::kQ8_0:
      return run_group_tiles<Q8_0Weights>(p, row_begin, row_end);
    case GgmlType::kQ4_0:
      return run_group_tiles<Q4_0Weights>(p, row_begin, row_end);
    default:
      KVLM_CHECK(false, "matmul_token_groups_avx512: weight type {}", ggml_type_name(p.w->type));
  }
}

}  // namespace kvlm::ops_internal
