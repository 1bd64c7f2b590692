// AVX2 kernel for the 32-element block types added after Q8_0 / Q4_0 (matmul_decode_avx2.h):
// vpmaddubsw of the codes with the activations (|v| and a·sign(v) for signed codes), then
// vpmaddwd by ones into int32 lanes.
#include <immintrin.h>

#include "ops/matmul_decode_avx2.h"

namespace kvlm::ops_internal {
namespace {

// 2 rows × 4 tokens: 8 f32 accumulators, 2 decoded blocks and the token's activations fit 16 ymm.
constexpr int kRows = 2;
constexpr int kTokens = 4;

struct Avx2Dot {
  // Pair sums of u·a stay below 2^15 for u ≤ 31 (2·31·127); for signed codes 2·127·127.
  static __m256i dot_unsigned(__m256i u, __m256i a) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), _mm256_set1_epi16(1));
  }
  static __m256i dot_signed(__m256i v, __m256i a) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(v), _mm256_sign_epi8(a, v)), _mm256_set1_epi16(1));
  }
};

}  // namespace

void matmul_rows_decoded_avx2(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  count_isa_kernel_run(Isa::kAvx2);
  run_block32<Avx2Dot, kRows, kTokens>(p, row_begin, row_end);
}

}  // namespace kvlm::ops_internal
