// The gated FFN of every llama-family block: y = down(act(gate x) ⊙ up x). Dense layers, routed
// experts and shared experts all run it.
#pragma once

#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "model/model_config.h"
#include "ops/matmul.h"

namespace kvlm {

struct GatedFfnScratch {
  std::vector<float> gate;  // [n, ffn]
  std::vector<float> up;    // [n, ffn]
};

// x: [n, gate.cols]; y: [n, down.rows], must not alias x.
void gated_ffn(const WeightMatrix& gate, const WeightMatrix& up, const WeightMatrix& down, FfnActivation activation,
               const float* x, int64_t n, ThreadPool& pool, GatedFfnScratch& scratch, float* y);

}  // namespace kvlm
