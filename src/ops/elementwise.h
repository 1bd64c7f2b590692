// Small per-vector ops of the transformer block: RMSNorm, SiLU-gated product, softmax, RoPE.
#pragma once

#include <cstdint>
#include <vector>

#include "core/ids.h"

namespace kvlm {

// out[i] = x[i] / sqrt(mean(x²) + eps) * weight[i]; out may alias x.
void rms_norm(const float* x, const float* weight, float* out, int64_t n, float eps);

// out[i] = silu(gate[i]) * up[i]; out may alias gate.
void silu_mul(const float* gate, const float* up, float* out, int64_t n);

// In-place, numerically stable softmax over n values.
void softmax(float* x, int64_t n);
// out[i] = gelu(gate[i]) * up[i], GELU in its tanh form 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// (gemma). out may alias gate.
void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n);

// How a head's dimensions are paired for rotation.
enum class RopeStyle {
  kNormal,  // adjacent pairs (2i, 2i+1): llama, mistral (GGML mode 0)
  kNeox,    // halves (i, i + rotary_dim/2): qwen2, gpt-neox (GGML mode 2)
};

// YaRN (Peng et al. 2023) in GGML's parameterisation, as GGUF files state it. Pair i's
// frequency mixes the interpolated one (freq_scale · f_i) and the original f_i with a ramp over
// the pair index: pairs that turn more than beta_fast times over the original context keep f_i,
// pairs that turn fewer than beta_slow times are interpolated, linear between. cos and sin are
// scaled by attn_factor · (1 + 0.1 ln(1 / freq_scale)), so q·k grows by its square.
struct RopeYarn {
  float ext_factor = 0.0f;   // 0: off (plain linear scaling); 1: YaRN's ramp
  float attn_factor = 1.0f;
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  int original_context = 0;  // the context the model was trained with before scaling
};

struct RopeParams {
  int head_dim = 0;
  int rotary_dim = 0;        // leading dims rotated (== head_dim for llama)
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;   // linear scaling: the angle uses position * freq_scale
  RopeStyle style = RopeStyle::kNormal;
  // Llama 3.x frequency factors (the rope_freqs tensor): pair i's frequency is divided by
  // freq_factors[i]. [rotary_dim / 2], or empty for none.
  std::vector<float> freq_factors = {};
  RopeYarn yarn = {};
};

// Pair i's angle per position: freq_base^(-2i/rotary_dim) / freq_factors[i], then linear
// scaling or YaRN's mix. [rotary_dim / 2]
std::vector<double> rope_pair_frequencies(const RopeParams& params);
// What cos and sin are multiplied by: 1, or YaRN's attention-scale correction.
double rope_magnitude(const RopeParams& params);

// Rotates x: [num_heads, head_dim] in place for position `pos`: pair i by the angle
// pos · rope_pair_frequencies(params)[i], scaled by rope_magnitude(params).
void rope_apply(const RopeParams& params, float* x, int num_heads, Position pos);

}  // namespace kvlm
