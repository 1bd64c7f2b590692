// Test data for the matmul tests: quantized weight matrices with the values they decode to, and
// activations shaped like a model's.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/quantize.h"
#include "ops/matmul.h"

namespace kvlm::testing {

// A weight matrix with its bytes and the exact f32 values they decode to.
struct TestWeights {
  GgmlType type;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> bytes;  // [rows, row_bytes]
  std::vector<float> dequant;  // [rows, cols]

  WeightMatrix matrix() const { return WeightMatrix{type, bytes.data(), rows, cols, ggml_row_bytes(type, cols)}; }
};

// Rows of normal values, of five magnitudes (row r scaled by 2^(r % 5 - 2)), quantized to type.
TestWeights make_weights(GgmlType type, int64_t rows, int64_t cols, uint32_t seed);

// x: [num_tokens, cols], tokens of varied magnitude with a few outliers, as activations have.
std::vector<float> make_activations(int64_t num_tokens, int64_t cols, uint32_t seed);

}  // namespace kvlm::testing
