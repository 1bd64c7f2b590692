// AVX-512 VNNI kernel for the 32-element block types added after Q8_0 / Q4_0
// (matmul_decode_avx2.h): one vpdpbusd per block and token (unsigned codes, or |v| with
// a·sign(v) for signed codes), with 32 registers for larger rows × tokens tiles.
#if !defined(__clang__)  // clang has no -Wmaybe-uninitialized
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "ops/matmul_decode_avx2.h"

namespace kvlm::ops_internal {
namespace {

// 4 rows × 4 tokens: 16 f32 accumulators and 4 decoded blocks of 32 ymm.
constexpr int kRows = 4;
constexpr int kTokens = 4;

struct Avx512Dot {
  static __m256i dot_unsigned(__m256i u, __m256i a) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, a); }
  static __m256i dot_signed(__m256i v, __m256i a) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(v), _mm256_sign_epi8(a, v));
  }
};

}  // namespace

void matmul_rows_decoded_avx512(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  count_isa_kernel_run(Isa::kAvx512);
  run_block32<Avx512Dot, kRows, kTokens>(p, row_begin, row_end);
}

}  // namespace kvlm::ops_internal
