// An 8 × 8 transpose of 32-bit elements in AVX2 registers, which the panel kernels use to turn
// 8 weight rows into vectors that hold one 4-byte group of each row.
#pragma once

#include <immintrin.h>

namespace kvlm::ops_internal {

// rows[i] holds 8 dwords of row i; afterwards rows[k] holds dword k of each row (row order).
inline void transpose_8x8_dwords(__m256i (&rows)[8]) {
  __m256i pairs[8];
  for (int i = 0; i < 8; i += 2) {
    pairs[i] = _mm256_unpacklo_epi32(rows[i], rows[i + 1]);
    pairs[i + 1] = _mm256_unpackhi_epi32(rows[i], rows[i + 1]);
  }
  __m256i quads[8];
  for (int i = 0; i < 8; i += 4) {
    quads[i] = _mm256_unpacklo_epi64(pairs[i], pairs[i + 2]);
    quads[i + 1] = _mm256_unpackhi_epi64(pairs[i], pairs[i + 2]);
    quads[i + 2] = _mm256_unpacklo_epi64(pairs[i + 1], pairs[i + 3]);
    quads[i + 3] = _mm256_unpackhi_epi64(pairs[i + 1], pairs[i + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    rows[k] = _mm256_permute2x128_si256(quads[k], quads[k + 4], 0x20);
    rows[k + 4] = _mm256_permute2x128_si256(quads[k], quads[k + 4], 0x31);
  }
}

}  // namespace kvlm::ops_internal
