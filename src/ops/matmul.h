// matmul: y = x · Wᵀ for every weight type kvlm supports, split across the thread pool.
#pragma once

#include <cstdint>
#include <span>

#include "core/dtype.h"
#include "core/thread_pool.h"

namespace kvlm {

// A weight matrix as GGUF stores it: `rows` rows (output features) of `cols`
// elements (input features) each, row-major, each row `row_bytes` long. Non-owning.
struct WeightMatrix {
  GgmlType type = GgmlType::kF32;
  const uint8_t* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  uint64_t row_bytes = 0;
};

// y[t][r] = sum_c W[r][c] * x[t][c] for t < num_tokens.
// x: [num_tokens, cols] f32, y: [num_tokens, rows] f32. Quantized types may quantize x
// to the weight's activation format first (as GGML does); tests bound that error.
void matmul(const WeightMatrix& w, const float* x, float* y, int64_t num_tokens, ThreadPool& pool);

// One output of a matmul whose input other matrices share: y = x · Wᵀ, y as matmul() takes it.
struct MatmulOutput {
  const WeightMatrix* w = nullptr;
  float* y = nullptr;
};

// matmul() of one input by several matrices (a layer's q/k/v, or gate and up), with the same
// results. Consecutive matrices of one type and width share one quantization of x and one pass
// of the pool over all their rows: a decode step runs ~7 matmuls a layer, and each pass ends
// with its threads waiting for the slowest.
void matmul_shared_input(std::span<const MatmulOutput> outs, const float* x, int64_t num_tokens, ThreadPool& pool);

// One row of a weight matrix as f32 (embedding lookup). dst: [cols].
void dequantize_weight_row(const WeightMatrix& w, int64_t row, float* dst);

}  // namespace kvlm
