#include "model/rope_scaling.h"

#include <cmath>
#include <numbers>

#include "core/quantize.h"
#include "gguf/gguf_file.h"
#include <fmt/ranges.h>

#include "model/llama_gguf_names.h"

namespace kvlm {
namespace {

namespace names = llama_names;

// An optional float key: `fallback` when absent, an error when present but not a positive finite number.
Result<double> optional_positive(const GgufFile& file, const std::string& key, double fallback) {
  if (file.find(key) == nullptr) return fallback;
  KVLM_ASSIGN_OR_RETURN(double v, file.get_float(key));
  if (!(v > 0.0) || !std::isfinite(v)) return Status::errorf("{}: metadata '{}' = {} must be positive", file.name(), key, v);
  return v;
}

// rope_freqs.weight: one f32 factor per rotated pair, as Llama 3.x converters write it.
Result<std::vector<float>> read_frequency_factors(const GgufFile& file, int rotary_dim) {
  const GgufTensorInfo* t = file.find_tensor(names::kRopeFreqs);
  const int num_pairs = rotary_dim / 2;
  if (t->dims.size() != 1 || t->dims[0] != num_pairs) {
    return Status::errorf("{}: tensor '{}' must have {} elements (rotary_dim / 2), has dims [{}]", file.name(),
                          names::kRopeFreqs, num_pairs, fmt::join(t->dims, ", "));
  }
  if (t->type != GgmlType::kF32 && t->type != GgmlType::kF16 && t->type != GgmlType::kBF16) {
    return Status::errorf("{}: tensor '{}' has type {}, expected f32", file.name(), names::kRopeFreqs,
                          ggml_type_name(t->type));
  }
  std::vector<float> factors(static_cast<size_t>(num_pairs));
  dequantize_row_reference(t->type, t->data, factors.data(), num_pairs);
  for (int i = 0; i < num_pairs; ++i) {
    const float f = factors[static_cast<size_t>(i)];
    if (!(f > 0.0f) || !std::isfinite(f)) {
      return Status::errorf("{}: tensor '{}' element {} = {} must be positive", file.name(), names::kRopeFreqs, i, f);
    }
  }
  return factors;
}

}  // namespace

const char* rope_scaling_kind_name(RopeScalingKind kind) {
  switch (kind) {
    case RopeScalingKind::kNone:
      return "none";
    case RopeScalingKind::kLinear:
      return "linear";
    case RopeScalingKind::kYarn:
      return "yarn";
    case RopeScalingKind::kLlama3:
      return "llama3";
  }
  return "?";
}

std::vector<float> llama3_frequency_factors(int rotary_dim, double freq_base, double factor, double low_freq_factor,
                                            double high_freq_factor, double original_context) {
  const double low_freq_wavelength = original_context / low_freq_factor;
  const double high_freq_wavelength = original_context / high_freq_factor;
  std::vector<float> out(static_cast<size_t>(rotary_dim / 2));
  for (int i = 0; i < rotary_dim / 2; ++i) {
    const double freq = std::pow(freq_base, -2.0 * i / rotary_dim);
    const double wavelength = 2.0 * std::numbers::pi / freq;
    double scaled = freq;
    if (wavelength > low_freq_wavelength) {
      scaled = freq / factor;
    } else if (wavelength >= high_freq_wavelength) {
      const double smooth = (original_context / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor);
      scaled = (1.0 - smooth) * freq / factor + smooth * freq;
    }
    out[static_cast<size_t>(i)] = static_cast<float>(freq / scaled);
  }
  return out;
}

Result<RopeConfig> read_rope_config(const GgufFile& file, const std::string& arch, int head_dim, int rotary_dim,
                                    RopeStyle style) {
  RopeConfig rc;
  RopeParams& p = rc.params;
  p.head_dim = head_dim;
  p.rotary_dim = rotary_dim;
  p.style = style;
  KVLM_ASSIGN_OR_RETURN(double base, optional_positive(file, names::key(arch, names::kRopeFreqBase), 10000.0));
  p.freq_base = static_cast<float>(base);

  const std::string type_key = names::key(arch, names::kRopeScalingType);
  const std::string factor_key = names::key(arch, names::kRopeScalingFactor);
  std::string type = "none";
  if (file.find(type_key) != nullptr) {
    KVLM_ASSIGN_OR_RETURN(type, file.get_string(type_key));
  } else if (file.find(names::key(arch, names::kRopeScaleLinear)) != nullptr) {
    type = "linear";  // older files: rope.scale_linear alone
  }
  // A scaling type without its factor is an error, never a silent factor of 1.
  auto factor = [&]() -> Result<double> {
    if (file.find(factor_key) != nullptr) return optional_positive(file, factor_key, 1.0);
    const std::string linear_key = names::key(arch, names::kRopeScaleLinear);
    if (file.find(linear_key) != nullptr) return optional_positive(file, linear_key, 1.0);
    return Status::errorf("{}: rope scaling '{}' needs metadata '{}'", file.name(), type, factor_key);
  };
  auto original_context = [&]() -> Result<double> {
    const std::string key = names::key(arch, names::kRopeScalingOrigContext);
    if (file.find(key) == nullptr) {
      return Status::errorf("{}: rope scaling '{}' needs metadata '{}'", file.name(), type, key);
    }
    return optional_positive(file, key, 0.0);
  };

  if (type == "none") {
    // Some converters write a factor of 1 beside "none"; anything else would be ignored.
    if (file.find(factor_key) != nullptr) {
      KVLM_ASSIGN_OR_RETURN(double f, factor());
      if (f != 1.0) {
        return Status::errorf("{}: rope scaling type 'none' with '{}' = {}: which one is meant?", file.name(),
                              factor_key, f);
      }
    }
  } else if (type == "linear") {
    KVLM_ASSIGN_OR_RETURN(double f, factor());
    rc.scaling = f == 1.0 ? RopeScalingKind::kNone : RopeScalingKind::kLinear;
    rc.scaling_factor = static_cast<float>(f);
    p.freq_scale = static_cast<float>(1.0 / f);
  } else if (type == "yarn") {
    KVLM_ASSIGN_OR_RETURN(double f, factor());
    KVLM_ASSIGN_OR_RETURN(double ctx, original_context());
    rc.scaling = RopeScalingKind::kYarn;
    rc.scaling_factor = static_cast<float>(f);
    p.freq_scale = static_cast<float>(1.0 / f);
    p.yarn.original_context = static_cast<int>(ctx);
    // GGML's defaults for a YaRN file: the full ramp, beta 32 / 1, no extra attention factor.
    KVLM_ASSIGN_OR_RETURN(double ext, optional_positive(file, names::key(arch, names::kRopeYarnExtFactor), 1.0));
    KVLM_ASSIGN_OR_RETURN(double attn, optional_positive(file, names::key(arch, names::kRopeYarnAttnFactor), 1.0));
    KVLM_ASSIGN_OR_RETURN(double fast, optional_positive(file, names::key(arch, names::kRopeYarnBetaFast), 32.0));
    KVLM_ASSIGN_OR_RETURN(double slow, optional_positive(file, names::key(arch, names::kRopeYarnBetaSlow), 1.0));
    KVLM_ASSIGN_OR_RETURN(double attn2, optional_positive(file, names::key(arch, names::kRopeScalingAttnFactor), 1.0));
    p.yarn.ext_factor = static_cast<float>(ext);
    p.yarn.attn_factor = static_cast<float>(attn * attn2);
    p.yarn.beta_fast = static_cast<float>(fast);
    p.yarn.beta_slow = static_cast<float>(slow);
  } else if (type == "llama3") {
    // The factors from the rope_scaling config, when a converter did not write rope_freqs.
    if (file.find_tensor(names::kRopeFreqs) == nullptr) {
      KVLM_ASSIGN_OR_RETURN(double f, factor());
      KVLM_ASSIGN_OR_RETURN(double ctx, original_context());
      KVLM_ASSIGN_OR_RETURN(double low, optional_positive(file, names::key(arch, names::kRopeLowFreqFactor), 1.0));
      KVLM_ASSIGN_OR_RETURN(double high, optional_positive(file, names::key(arch, names::kRopeHighFreqFactor), 4.0));
      if (!(high > low)) {
        return Status::errorf("{}: llama3 rope scaling needs high_freq_factor {} > low_freq_factor {}", file.name(),
                              high, low);
      }
      p.freq_factors = llama3_frequency_factors(rotary_dim, base, f, low, high, ctx);
      rc.scaling_factor = static_cast<float>(f);
    }
    rc.scaling = RopeScalingKind::kLlama3;
  } else {
    return Status::errorf("{}: rope scaling type '{}' ({}) is not supported (none, linear, yarn, llama3)", file.name(),
                          type, type_key);
  }

  if (file.find_tensor(names::kRopeFreqs) != nullptr) {
    if (rc.scaling == RopeScalingKind::kYarn) {
      return Status::errorf("{}: both YaRN scaling and a '{}' tensor: not supported together", file.name(),
                            names::kRopeFreqs);
    }
    KVLM_ASSIGN_OR_RETURN(p.freq_factors, read_frequency_factors(file, rotary_dim));
    rc.scaling = RopeScalingKind::kLlama3;
  }
  return rc;
}

}  // namespace kvlm
