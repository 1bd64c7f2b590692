// Small per-vector ops of the transformer block: RMSNorm, SiLU-gated product, softmax, RoPE.
#pragma once

#include <cstdint>

#include "core/ids.h"

namespace kvlm {

// out[i] = x[i] / sqrt(mean(x²) + eps) * weight[i]; out may alias x.
void rms_norm(const float* x, const float* weight, float* out, int64_t n, float eps);

// out[i] = silu(gate[i]) * up[i]; out may alias gate.
void silu_mul(const float* gate, const float* up, float* out, int64_t n);

// In-place, numerically stable softmax over n values.
void softmax(float* x, int64_t n);

// How a head's dimensions are paired for rotation.
enum class RopeStyle {
  kNormal,  // adjacent pairs (2i, 2i+1): llama, mistral (GGML mode 0)
  kNeox,    // halves (i, i + rotary_dim/2): qwen2, gpt-neox (GGML mode 2)
};

struct RopeParams {
  int head_dim = 0;
  int rotary_dim = 0;        // leading dims rotated (== head_dim for llama)
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;   // linear scaling: the angle uses position * freq_scale
  RopeStyle style = RopeStyle::kNormal;
};

// Rotates x: [num_heads, head_dim] in place for position `pos`.
// Pair i uses angle pos * freq_scale * freq_base^(-2i/rotary_dim).
void rope_apply(const RopeParams& params, float* x, int num_heads, Position pos);

}  // namespace kvlm
