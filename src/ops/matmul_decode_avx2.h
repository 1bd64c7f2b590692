// Internal to ops/: the fused kernel for the 32-element block types added after Q8_0 / Q4_0
// (Q4_1, Q5_0, Q5_1, IQ4_NL) on AVX2 and AVX-512: each block is decoded into one register and
// dotted with the int8 activations of every token of a rows × tokens tile, never through memory.
// The ISA's file supplies the integer dot (Dot::dot_unsigned: Σ u·a over 4-element lanes,
// u unsigned ≤ 31; Dot::dot_signed: the same for signed v, |v| ≤ 127).
// Included only by files compiled with AVX2 (matmul_decoded_avx2.cc, matmul_decoded_avx512.cc);
// unnamed namespace for the same reason as matmul_decode.h.
#pragma once

#include <immintrin.h>

#include "core/check.h"
#include "ops/half_f16c.h"
#include "ops/matmul_decode.h"

namespace kvlm::ops_internal {
namespace {

inline __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

// 16 bytes of nibbles → 32 bytes: low nibbles (elements 0-15), then high nibbles (16-31).
inline __m256i nibbles_to_bytes(__m128i packed) {
  const __m128i mask = _mm_set1_epi8(0x0f);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), mask), _mm_and_si128(packed, mask));
}

// 32 bits (little-endian u32 at p) → 32 bytes of 0 or 16: byte i is 16 when bit i is set.
inline __m256i bits_to_sixteens(const uint8_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int32_t>(bits)),
                                             _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
                                                              2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(16));
}

// One block in registers: value = d·v + m, with v unsigned codes (kSigned false) or signed.
struct Block32 {
  __m256i v;
  float d;
  float m;  // the block's constant term: its min (Q4_1, Q5_1), -16·d (Q5_0: codes stored +16)
};

template <GgmlType kType>
inline Block32 decode_block32_regs(const uint8_t* b) {
  Block32 out;
  out.d = half_f16c(b);
  if constexpr (kType == GgmlType::kQ4_1) {
    out.m = half_f16c(b + 2);
    out.v = nibbles_to_bytes(load128(b + 4));
  } else if constexpr (kType == GgmlType::kQ5_0) {
    out.m = -16.0f * out.d;
    out.v = _mm256_or_si256(nibbles_to_bytes(load128(b + 6)), bits_to_sixteens(b + 2));
  } else if constexpr (kType == GgmlType::kQ5_1) {
    out.m = half_f16c(b + 2);
    out.v = _mm256_or_si256(nibbles_to_bytes(load128(b + 8)), bits_to_sixteens(b + 4));
  } else {
    static_assert(kType == GgmlType::kIQ4_NL);
    out.m = 0.0f;
    const __m128i grid = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4Values));
    out.v = _mm256_shuffle_epi8(_mm256_set_m128i(grid, grid), nibbles_to_bytes(load128(b + 2)));
  }
  return out;
}

inline float hsum_ps(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// y for rows [r0, r0 + R) × tokens [t0, t0 + T): per block, f32 lanes += d·dx·(int32 lanes of
// Σ v·a), and a scalar += m·dx·Σa. Every (row, token) runs the same operations whatever R
// and T are, so tile shapes never change a result.
template <class Dot, GgmlType kType, int R, int T>
void block32_tile(const MatmulProblem& p, int64_t r0, int64_t t0) {
  constexpr bool kSigned = kType == GgmlType::kIQ4_NL;
  constexpr uint64_t kBytes = kType == GgmlType::kQ4_1   ? sizeof(BlockQ4_1)
                              : kType == GgmlType::kQ5_0 ? sizeof(BlockQ5_0)
                              : kType == GgmlType::kQ5_1 ? sizeof(BlockQ5_1)
                                                         : sizeof(BlockIq4Nl);
  const WeightMatrix& w = *p.w;
  const QuantizedActivations& xq = *p.xq;
  const uint8_t* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = w.data + static_cast<uint64_t>(r0 + r) * w.row_bytes;
  const int64_t ahead = 8 * static_cast<int64_t>(w.row_bytes);  // prefetch 8 rows ahead
  __m256 acc[R][T];
  float acc_m[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      acc[r][t] = _mm256_setzero_ps();
      acc_m[r][t] = 0.0f;
    }
  }
  for (int64_t b = 0; b < xq.num_blocks; ++b) {
    Block32 blk[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const uint8_t* at = rows[r] + b * kBytes;
      _mm_prefetch(reinterpret_cast<const char*>(at + ahead), _MM_HINT_T0);
      blk[r] = decode_block32_regs<kType>(at);
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const int64_t idx = (t0 + t) * xq.num_blocks + b;
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq.qs + idx * 32));
      const float dx = xq.scales[idx];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256i dot = kSigned ? Dot::dot_signed(blk[r].v, a) : Dot::dot_unsigned(blk[r].v, a);
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(blk[r].d * dx), acc[r][t]);
        if constexpr (!kSigned) acc_m[r][t] += blk[r].m * dx * static_cast<float>(xq.sums[idx]);
      }
    }
  }
  for (int t = 0; t < T; ++t) {
    for (int r = 0; r < R; ++r) p.y[(t0 + t) * w.rows + r0 + r] = hsum_ps(acc[r][t]) + acc_m[r][t];
  }
}

// Full R × T tiles where they fit, then 1-row / 1-token tiles (the same operations per element).
template <class Dot, GgmlType kType, int R, int T>
void run_block32_tiles(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  int64_t r = row_begin;
  for (; r + R <= row_end; r += R) {
    int64_t t = p.token_begin;
    for (; t + T <= p.token_end; t += T) block32_tile<Dot, kType, R, T>(p, r, t);
    for (; t < p.token_end; ++t) block32_tile<Dot, kType, R, 1>(p, r, t);
  }
  for (; r < row_end; ++r) {
    int64_t t = p.token_begin;
    for (; t + T <= p.token_end; t += T) block32_tile<Dot, kType, 1, T>(p, r, t);
    for (; t < p.token_end; ++t) block32_tile<Dot, kType, 1, 1>(p, r, t);
  }
}

template <class Dot, int R, int T>
void run_block32(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  switch (p.w->type) {
    case GgmlType::kQ4_1:
      return run_block32_tiles<Dot, GgmlType::kQ4_1, R, T>(p, row_begin, row_end);
    case GgmlType::kQ5_0:
      return run_block32_tiles<Dot, GgmlType::kQ5_0, R, T>(p, row_begin, row_end);
    case GgmlType::kQ5_1:
      return run_block32_tiles<Dot, GgmlType::kQ5_1, R, T>(p, row_begin, row_end);
    case GgmlType::kIQ4_NL:
      return run_block32_tiles<Dot, GgmlType::kIQ4_NL, R, T>(p, row_begin, row_end);
    default:
      KVLM_CHECK(false, "fused 32-element block kernel: weight type {}", ggml_type_name(p.w->type));
  }
}

}  // namespace
}  // namespace kvlm::ops_internal
