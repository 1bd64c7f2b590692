// Internal to ops/: the super-block types' scale unpacks in vector registers, for the AVX-512
// row kernel (matmul_super_avx512.cc): each replaces the scalar unpack of
// matmul_super_decode_avx2.h with the same results (the matmul tests run every byte value of
// every scale field through the kernel against the reference). The group kernel's staging keeps
// the scalar ones: amortized over its tokens, the vector ones measured no different there
// (16 and 512 tokens, Q4_K and Q3_K). _mm_srlv_epi16 needs AVX-512 BW + VL. Unnamed
// namespace: each ISA's file compiles its own copy with its own flags.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "ops/half_f16c.h"
#include "ops/matmul_super_decode_avx2.h"

namespace kvlm::ops_internal {
namespace {

// Q4_K / Q5_K scales and mins (k_scale_min) unpacked in vector registers from one 16-byte load
// of d, dmin and the 12 packed bytes: bytes 4-7 hold scales 0-3 in their low 6 bits and the top
// 2 bits of scales 4-7, bytes 8-11 the same for the mins, bytes 12-15 the low 4 bits of scales
// 4-7 (low nibbles) and mins 4-7 (high). The scalar unpack (k_quant_scales_6bit) took ~25
// integer instructions, a third of the AVX-512 row kernel's decode loop; the AVX2 kernel keeps
// it, since there the integer ports are idle and the vector ones are not (measured 3-5% slower).
inline SuperScales k_quant_scales_6bit_vector(const uint8_t* b) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
  // Lanes 0-7 become the scales, 8-15 the mins.
  const __m128i low6 = _mm_shuffle_epi8(v, _mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
  const __m128i top2 = _mm_shuffle_epi8(v, _mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11));
  const __m128i nibbles = _mm_blend_epi32(low6, _mm_srli_epi16(low6, 4), 0b1000);  // mins 4-7: high nibbles
  const __m128i m = _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15);
  const __m128i packed =
      _mm_or_si128(_mm_and_si128(nibbles, m), _mm_and_si128(_mm_srli_epi16(top2, 2), _mm_set1_epi8(0x30)));
  // Each 32-element sub-block's scale and min to two 16-element lanes.
  const __m128i pairs = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  SuperScales s;
  s.k16 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(packed, pairs));
  s.mn16 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(packed, _mm_add_epi8(pairs, _mm_set1_epi8(8))));
  s.d = half_f16c(b);
  s.dmin = half_f16c(b + 2);
  return s;
}

// IQ4_XS sub-block scales unpacked in vector registers: ls_s = nibble s % 2 of scales_l[s / 2]
// | bits 2s, 2s+1 of scales_h << 4, from one 16-byte load (d, scales_h, scales_l, 8 code bytes).
inline SuperScales iq4_xs_scales_vector(const uint8_t* b) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
  // Word j (< 4) = scales_l[j]: bytes 2j, 2j+1 get its low and high nibble.
  const __m128i lw = _mm_shuffle_epi8(v, _mm_setr_epi8(4, -1, 5, -1, 6, -1, 7, -1, -1, -1, -1, -1, -1, -1, -1, -1));
  const __m128i low = _mm_and_si128(_mm_or_si128(lw, _mm_slli_epi16(lw, 4)), _mm_set1_epi16(0x0f0f));
  // Word j = scales_h >> 4j: its bits 0-1 go to bits 4-5 of byte 2j, bits 2-3 to those of 2j + 1.
  const __m128i hw = _mm_shuffle_epi8(v, _mm_setr_epi8(2, 3, 2, 3, 2, 3, 2, 3, -1, -1, -1, -1, -1, -1, -1, -1));
  const __m128i y = _mm_srlv_epi16(hw, _mm_setr_epi16(0, 4, 8, 12, 0, 0, 0, 0));
  const __m128i high = _mm_or_si128(_mm_and_si128(_mm_slli_epi16(y, 4), _mm_set1_epi16(0x0030)),
                                    _mm_and_si128(_mm_slli_epi16(y, 10), _mm_set1_epi16(0x3000)));
  const __m128i ls = _mm_or_si128(low, high);
  const __m128i pairs = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  SuperScales s;
  s.k16 = _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm_shuffle_epi8(ls, pairs)), _mm256_set1_epi16(32));
  s.mn16 = _mm256_setzero_si256();
  s.d = half_f16c(b);
  s.dmin = 0.0f;
  return s;
}

// Q3_K sub-block scales unpacked in vector registers: 12 bytes at offset 96, of which bytes 0-7
// hold the low 4 bits of scales 0-7 (low nibbles) and 8-15 (high), bytes 8-11 the high 2 bits
// (scale s: bits 2(s / 4), 2(s / 4) + 1 of byte s % 4). One 16-byte load ending with d (offset
// 94, so that it stays inside the 110-byte block).
inline SuperScales q3_k_scales_vector(const uint8_t* b) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 94));  // scales at byte 2
  const __m128i lows = _mm_shuffle_epi8(v, _mm_setr_epi8(2, 3, 4, 5, 6, 7, 8, 9, 2, 3, 4, 5, 6, 7, 8, 9));
  const __m128i low = _mm_and_si128(_mm_blend_epi32(lows, _mm_srli_epi16(lows, 4), 0b1100), _mm_set1_epi8(15));
  const __m128i highs = _mm_shuffle_epi8(v, _mm_setr_epi8(10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13));
  const __m128i high2 = _mm_and_si128(_mm_srlv_epi32(highs, _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
  return SuperQ3K::from_raw(_mm_or_si128(low, _mm_slli_epi16(high2, 4)), b);
}

// The register decoders with their scales unpacked as above.
struct SuperQ3KVectorScales : SuperQ3K {
  static SuperScales scales(const uint8_t* b) { return q3_k_scales_vector(b); }
};
struct SuperQ4KVectorScales : SuperQ4K {
  static SuperScales scales(const uint8_t* b) { return k_quant_scales_6bit_vector(b); }
};
struct SuperQ5KVectorScales : SuperQ5K {
  static SuperScales scales(const uint8_t* b) { return k_quant_scales_6bit_vector(b); }
};
struct SuperIq4XsVectorScales : SuperIq4Xs {
  static SuperScales scales(const uint8_t* b) { return iq4_xs_scales_vector(b); }
};

}  // namespace
}  // namespace kvlm::ops_internal
