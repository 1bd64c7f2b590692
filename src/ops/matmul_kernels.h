// Internal to ops/: the per-ISA matmul kernels behind matmul() and the quantized activation
// format they share. Tests call each ISA directly so every path this CPU can run is checked.
#pragma once

#include <cstdint>
#include <memory>

#include "core/thread_pool.h"
#include "ops/isa.h"
#include "ops/matmul.h"

namespace kvlm::ops_internal {

// Activations quantized for integer dot products with Q8_0 / Q4_0 weights: each block of
// 32 values of a token becomes int8 q with x ≈ d·q, d = amax/127, q rounded to nearest even.
// SIMD kernels form int32 partial dots over 4 consecutive elements ("lanes", 8 per block),
// so the scale and the bias are stored once per lane and load as vectors directly.
// Every ISA's quantizer produces bit-identical contents.
struct QuantizedActivations {
  int64_t num_tokens = 0;
  int64_t num_blocks = 0;  // per token: cols / 32
  int8_t* qs = nullptr;    // [num_tokens, num_blocks, 32]
  float* scales = nullptr; // [num_tokens, num_blocks, 8]   d of the block, repeated per lane
  int32_t* bias = nullptr; // [num_tokens, num_blocks, 8]   -bias_offset · (sum of the lane's 4 q)

  // Bytes one token takes in the three arrays.
  static int64_t bytes_per_token(int64_t num_blocks) { return num_blocks * (32 + 8 * 4 + 8 * 4); }
};

// Owns the storage of a QuantizedActivations (64-byte aligned); grows, never shrinks.
class ActivationBuffer {
 public:
  QuantizedActivations view(int64_t num_tokens, int64_t num_blocks);

 private:
  std::unique_ptr<uint8_t[]> storage_;
  int64_t capacity_ = 0;
};

// Quantizes tokens [token_begin, token_end) of x: [num_tokens, cols] into out.
// bias_offset is what the ISA's kernel adds to each weight before its integer dot
// (activation_bias_offset), so the bias lanes cancel it; 0 leaves bias unwritten.
using QuantizeActivationsFn = void (*)(const float* x, int64_t cols, int64_t token_begin, int64_t token_end,
                                       int32_t bias_offset, const QuantizedActivations& out);
void quantize_activations_portable(const float* x, int64_t cols, int64_t token_begin, int64_t token_end,
                                   int32_t bias_offset, const QuantizedActivations& out);
void quantize_activations_avx2(const float* x, int64_t cols, int64_t token_begin, int64_t token_end,
                               int32_t bias_offset, const QuantizedActivations& out);
void quantize_activations_avx512(const float* x, int64_t cols, int64_t token_begin, int64_t token_end,
                                 int32_t bias_offset, const QuantizedActivations& out);

// The unsigned offset an ISA's integer kernel adds to weight values of `type`
// (Q4_0 nibbles are stored +8; VNNI needs unsigned × signed, so Q8_0 weights get +128 there).
int32_t activation_bias_offset(Isa isa, GgmlType type);

// One call's operands. Kernels compute y[t][r] for t in [token_begin, token_end) and the
// rows they are given; each element is summed in an order fixed by (cols, type, ISA) alone,
// so results do not depend on how rows or tokens are split (thread count, batch size).
struct MatmulProblem {
  const WeightMatrix* w = nullptr;
  const float* x = nullptr;                   // [num_tokens, cols] f32 (F32/F16/BF16 weights)
  const QuantizedActivations* xq = nullptr;   // quantized x (Q8_0/Q4_0 weights)
  float* y = nullptr;                         // [num_tokens, rows]
  int64_t token_begin = 0;
  int64_t token_end = 0;
};

using MatmulRowsFn = void (*)(const MatmulProblem& p, int64_t row_begin, int64_t row_end);
void matmul_rows_portable(const MatmulProblem& p, int64_t row_begin, int64_t row_end);
void matmul_rows_avx2(const MatmulProblem& p, int64_t row_begin, int64_t row_end);
void matmul_rows_avx512(const MatmulProblem& p, int64_t row_begin, int64_t row_end);

// matmul() on a chosen ISA (which the CPU must support): quantizes x if the weight type
// needs it, then splits rows over the pool.
void matmul_with_isa(Isa isa, const WeightMatrix& w, const float* x, float* y, int64_t num_tokens,
                     ThreadPool& pool);

}  // namespace kvlm::ops_internal
