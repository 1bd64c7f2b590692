// read_rope_params: a model's RoPE as its GGUF file states it (base, rotated dims, linear
// scaling, YaRN, Llama 3.x frequency factors). Anything it does not understand is an error.
#pragma once

#include <string>

#include "core/status.h"
#include "ops/elementwise.h"

namespace kvlm {

class GgufFile;

// What kind of scaling a model's RoPE uses, for inspect and errors.
enum class RopeScalingKind { kNone, kLinear, kYarn, kLlama3 };
const char* rope_scaling_kind_name(RopeScalingKind kind);

struct RopeConfig {
  RopeParams params;
  RopeScalingKind scaling = RopeScalingKind::kNone;
  float scaling_factor = 1.0f;  // the context extension factor the file states
};

// Llama 3.x frequency factors computed from the rope_scaling config (what the converter writes
// as rope_freqs.weight): pairs whose wavelength is shorter than original_context /
// high_freq_factor keep their frequency (factor 1), longer than original_context /
// low_freq_factor are slowed by `factor`, and a smooth blend between. [rotary_dim / 2]
std::vector<float> llama3_frequency_factors(int rotary_dim, double freq_base, double factor, double low_freq_factor,
                                            double high_freq_factor, double original_context);

// Reads "<arch>.rope.*" and the rope_freqs.weight tensor. head_dim and rotary_dim are given (the
// caller read them); style is the architecture's pairing.
Result<RopeConfig> read_rope_config(const GgufFile& file, const std::string& arch, int head_dim, int rotary_dim,
                                    RopeStyle style);

}  // namespace kvlm
