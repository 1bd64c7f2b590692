// AVX-512 VNNI integer dots for the decoded-block kernels (matmul_decode.h): vpdpbusd on |v|
// (unsigned) and a·sign(v), 64 bytes (4 sub-blocks of 16) per instruction, then the int32
// lanes times the sub-block scales.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "ops/matmul_decode_avx2.h"

namespace kvlm::ops_internal {
namespace {

// The decoders write v 32 bytes at a time and k one value at a time: reading them back in the
// same widths lets the stores forward (a 64-byte load over two 32-byte stores stalls).
inline __m512i load_v64(const int8_t* v) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_load_si256(reinterpret_cast<const __m256i*>(v))),
                            _mm256_load_si256(reinterpret_cast<const __m256i*>(v + 32)), 1);
}
inline __m512i scales_epi32(const int16_t* k) {
  return _mm512_setr_epi32(k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7], k[8], k[9], k[10], k[11], k[12], k[13],
                           k[14], k[15]);
}

// Codes that are all ≥ 0 (at most 31) go straight in as vpdpbusd's unsigned operand.
inline int32_t dot_super_unsigned(const DecodedSuper& blk, const int8_t* a) {
  const __m512i sub_of_lane = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  const __m512i k_all = scales_epi32(blk.k);
  __m512i acc = _mm512_setzero_si512();
  for (int step = 0; step < 4; ++step) {
    const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), load_v64(blk.v + 64 * step),
                                            _mm512_loadu_si512(a + 64 * step));
    const __m512i k = _mm512_permutexvar_epi32(_mm512_add_epi32(sub_of_lane, _mm512_set1_epi32(4 * step)), k_all);
    acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(dot, k));
  }
  return _mm512_reduce_add_epi32(acc);
}

struct Avx512Dot {
  static void decode32(GgmlType type, const uint8_t* b, Decoded32& out) { decode_block32_avx2(type, b, out); }
  static void decode_super_block(GgmlType type, const uint8_t* b, DecodedSuper& out) { decode_super_avx2(type, b, out); }
  static int32_t dot32(const int8_t* v, const int8_t* a) {
    const __m256i vv = _mm256_load_si256(reinterpret_cast<const __m256i*>(v));
    const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
    const __m256i signed_a = _mm256_sign_epi8(av, vv);
    const __m256i dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(vv), signed_a);
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(dot), _mm256_extracti128_si256(dot, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
  }
  static int32_t min_dot(const DecodedSuper& blk, const int16_t* bsums) { return min_dot_avx2(blk, bsums); }
  static int32_t dot_super(const DecodedSuper& blk, const int8_t* a) {
    if (blk.non_negative) return dot_super_unsigned(blk, a);
    // Lane i of a step's dot covers elements 4i..4i+3 of its 64, i.e. sub-block i / 4.
    const __m512i sub_of_lane = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i k_all = scales_epi32(blk.k);
    __m512i acc = _mm512_setzero_si512();
    for (int step = 0; step < 4; ++step) {
      const __m512i vv = load_v64(blk.v + 64 * step);
      const __m512i av = _mm512_loadu_si512(a + 64 * step);
      const __mmask64 negative = _mm512_movepi8_mask(vv);
      const __m512i signed_a = _mm512_mask_sub_epi8(av, negative, _mm512_setzero_si512(), av);
      const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(vv), signed_a);
      const __m512i k = _mm512_permutexvar_epi32(_mm512_add_epi32(sub_of_lane, _mm512_set1_epi32(4 * step)), k_all);
      acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(dot, k));
    }
    return _mm512_reduce_add_epi32(acc);
  }
};

}  // namespace

void matmul_rows_decoded_avx512(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  count_isa_kernel_run(Isa::kAvx512);
  run_decoded_rows<Avx512Dot>(p, row_begin, row_end);
}

}  // namespace kvlm::ops_internal
