// AVX2 integer dots for the decoded-block kernels (matmul_decode.h): vpmaddubsw on |v| and
// a·sign(v), then vpmaddwd by the sub-block scales (or by ones).
#include <immintrin.h>

#include "ops/matmul_decode_avx2.h"

namespace kvlm::ops_internal {
namespace {

inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// 16 int16 pair sums of v·a over 32 bytes: |v| ≤ 128 and |a| ≤ 127 keep each pair below 2^15.
inline __m256i pair_products(const int8_t* v, const int8_t* a) {
  const __m256i vv = _mm256_load_si256(reinterpret_cast<const __m256i*>(v));
  const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
  return _mm256_maddubs_epi16(_mm256_abs_epi8(vv), _mm256_sign_epi8(av, vv));
}

struct Avx2Dot {
  static void decode32(GgmlType type, const uint8_t* b, Decoded32& out) { decode_block32_avx2(type, b, out); }
  static void decode_super_block(GgmlType type, const uint8_t* b, DecodedSuper& out) { decode_super_avx2(type, b, out); }
  static int32_t dot32(const int8_t* v, const int8_t* a) {
    return hsum_epi32(_mm256_madd_epi16(pair_products(v, a), _mm256_set1_epi16(1)));
  }
  static int32_t min_dot(const DecodedSuper& blk, const int16_t* bsums) { return min_dot_avx2(blk, bsums); }
  static int32_t dot_super(const DecodedSuper& blk, const int8_t* a) {
    __m256i acc = _mm256_setzero_si256();
    for (int s = 0; s < 16; s += 2) {  // 32 elements: sub-blocks s (int16 lanes 0-7) and s+1 (8-15)
      const __m256i k = _mm256_set_m128i(_mm_set1_epi16(blk.k[s + 1]), _mm_set1_epi16(blk.k[s]));
      // Codes of at most 31 are already the unsigned operand.
      const __m256i pairs =
          blk.non_negative
              ? _mm256_maddubs_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(blk.v + 16 * s)),
                                     _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 16 * s)))
              : pair_products(blk.v + 16 * s, a + 16 * s);
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, k));
    }
    return hsum_epi32(acc);
  }
};

}  // namespace

void matmul_rows_decoded_avx2(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  count_isa_kernel_run(Isa::kAvx2);
  run_decoded_rows<Avx2Dot>(p, row_begin, row_end);
}

}  // namespace kvlm::ops_internal
