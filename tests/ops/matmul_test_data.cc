#include "ops/matmul_test_data.h"

#include <cmath>
#include <random>


namespace kvlm::testing {

TestWeights make_weights(GgmlType type, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  TestWeights w{type, rows, cols, {}, {}};
  const uint64_t row_bytes = ggml_row_bytes(type, cols);
  w.bytes.resize(row_bytes * rows);
  w.dequant.resize(rows * cols);
  std::vector<float> src(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float row_scale = std::exp2(static_cast<float>(static_cast<int>(r % 5) - 2));  // rows of varied magnitude
    for (float& v : src) v = normal(rng) * row_scale;
    quantize_row_reference(type, src.data(), w.bytes.data() + r * row_bytes, cols);
    dequantize_row_reference(type, w.bytes.data() + r * row_bytes, w.dequant.data() + r * cols, cols);
  }
  return w;
}

std::vector<float> make_activations(int64_t num_tokens, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(num_tokens * cols);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float token_scale = 0.1f + static_cast<float>(t % 4);
    for (int64_t c = 0; c < cols; ++c) x[t * cols + c] = normal(rng) * token_scale;
    x[t * cols + (t * 7) % cols] *= 20.0f;
  }
  return x;
}

}  // namespace kvlm::testing
