// Portable integer dots for the decoded-block kernels (matmul_decode.h).
#include "ops/matmul_decode.h"

namespace kvlm::ops_internal {
namespace {

struct PortableDot {
  static void decode32(GgmlType type, const uint8_t* b, Decoded32& out) { decode_block32(type, b, out); }
  static void decode_super_block(GgmlType type, const uint8_t* b, DecodedSuper& out) { decode_super(type, b, out); }
  static int32_t dot32(const int8_t* v, const int8_t* a) {
    int32_t sum = 0;
    for (int i = 0; i < 32; ++i) sum += v[i] * a[i];
    return sum;
  }
  static int32_t min_dot(const DecodedSuper& blk, const int16_t* bsums) {
    int32_t sum = 0;
    for (int s = 0; s < 16; ++s) sum += blk.mn[s] * bsums[s];
    return sum;
  }
  static int32_t dot_super(const DecodedSuper& blk, const int8_t* a) {
    int32_t sum = 0;
    for (int s = 0; s < 16; ++s) {
      int32_t sub = 0;
      for (int i = 0; i < 16; ++i) sub += blk.v[16 * s + i] * a[16 * s + i];
      sum += blk.k[s] * sub;
    }
    return sum;
  }
};

}  // namespace

void matmul_rows_decoded_portable(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  count_isa_kernel_run(Isa::kPortable);
  run_decoded_rows<PortableDot>(p, row_begin, row_end);
}

}  // namespace kvlm::ops_internal
