#include "plan/model_shape.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <memory>

#include <fmt/format.h>

namespace kvlm {
namespace {

// Bounds that keep every planner product inside 64 bits (layers × heads × dims × 4 bytes ×
// block size stays below 2^50) and catch typos such as an extra zero.
constexpr int kMaxLayers = 4096;
constexpr int kMaxHeads = 4096;
constexpr int kMaxHeadDim = 65536;
constexpr int64_t kMaxContext = int64_t{1} << 31;

// Public model facts, from the models' own configuration files and papers:
// - Llama 2 7B: Touvron et al. 2023 (arXiv 2307.09288), Table 1 and the HF config
//   (hidden 4096, 32 layers, 32 heads, no GQA at 7B, max_position_embeddings 4096); 6.74e9 parameters.
// - Llama 3 8B: Meta's model card and HF config (32 layers, 32 heads, 8 KV heads, hidden 4096,
//   context 8192); 8.03e9 parameters.
// - Llama 3.2 1B: HF config (16 layers, hidden 2048, 32 heads, 8 KV heads, head_dim 64,
//   max_position_embeddings 131072); 1.24e9 parameters.
// - DeepSeek-V2-Lite: HF config.json (27 layers, hidden 2048, 16 heads, kv_lora_rank 512,
//   qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128) and model card (15.7e9 parameters,
//   context length 32k). The config's max_position_embeddings is 163840 = 4096 × YaRN factor 40;
//   we use the model card's 32768, which is what the model was evaluated at.
// - DeepSeek-V2: DeepSeek-AI 2024 (arXiv 2405.04434) §3.1 and the HF config (60 layers, hidden 5120,
//   128 heads, kv_lora_rank 512, qk_rope_head_dim 64, qk_nope 128, v_head_dim 128, 236e9 total
//   parameters, context 128K = 131072).
// - Gemma 3 1B/4B/12B/27B: the HF config.json of each (google/gemma-3-*-pt): layers 26/34/48/62,
//   hidden 1152/2560/3840/5376, heads 4/8/16/32, KV heads 1/4/8/16, head_dim 256/256/256/128,
//   sliding_window 512/1024/1024/1024, sliding_window_pattern 6 (every 6th layer global),
//   max_position_embeddings 32768 (1B) and 131072. The parameter counts are approximate
//   (≈1.0e9, ≈3.9e9, ≈1.2e10, ≈2.7e10: the public figures, rounded).
// MLA presets list num_kv_heads = num_heads: the expanded (MHA-equivalent) cache.
ModelShape preset(std::string name, std::string arch, int layers, int heads, int kv_heads, int head_dim,
                  int v_head_dim, int64_t context, double params, int kv_lora_rank, int rope_dim) {
  ModelShape s;
  s.name = std::move(name);
  s.architecture = std::move(arch);
  s.num_layers = layers;
  s.num_heads = heads;
  s.num_kv_heads = kv_heads;
  s.head_dim = head_dim;
  s.v_head_dim = v_head_dim;
  s.context_length = context;
  s.num_params = params;
  s.kv_lora_rank = kv_lora_rank;
  s.rope_head_dim = rope_dim;
  return s;
}

// `s` with Gemma 3's local layers: a window of `window` tokens on every layer but each 6th.
ModelShape with_gemma3_window(ModelShape s, int window) {
  s.sliding_window.window = window;
  s.sliding_window.local_layers = local_layers_from_period(kGemma3SlidingWindowPeriod, s.num_layers);
  return s;
}

const std::vector<ModelShape>& presets() {
  static const std::vector<ModelShape> kPresets = {
      preset("llama-2-7b", "llama", 32, 32, 32, 128, 128, 4096, 6.74e9, 0, 0),
      preset("llama-3-8b", "llama", 32, 32, 8, 128, 128, 8192, 8.03e9, 0, 0),
      preset("llama-3.2-1b", "llama", 16, 32, 8, 64, 64, 131072, 1.24e9, 0, 0),
      preset("deepseek-v2-lite", "deepseek2", 27, 16, 16, 192, 128, 32768, 15.7e9, 512, 64),
      preset("deepseek-v2", "deepseek2", 60, 128, 128, 192, 128, 131072, 236e9, 512, 64),
      with_gemma3_window(preset("gemma-3-1b", "gemma3", 26, 4, 1, 256, 256, 32768, 1.0e9, 0, 0), 512),
      with_gemma3_window(preset("gemma-3-4b", "gemma3", 34, 8, 4, 256, 256, 131072, 3.9e9, 0, 0), 1024),
      with_gemma3_window(preset("gemma-3-12b", "gemma3", 48, 16, 8, 256, 256, 131072, 1.2e10, 0, 0), 1024),
      with_gemma3_window(preset("gemma-3-27b", "gemma3", 62, 32, 16, 128, 128, 131072, 2.7e10, 0, 0), 1024),
  };
  return kPresets;
}

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

// An integer key that must fit an int and be positive.
Result<int> positive_int(const GgufFile& file, const std::string& key) {
  KVLM_ASSIGN_OR_RETURN(int64_t v, file.get_int(key));
  if (v <= 0 || v > kMaxHeadDim * int64_t{64}) {
    return Status::errorf("{}: {} = {} is out of range", file.name(), key, v);
  }
  return static_cast<int>(v);
}

// An optional integer key: `fallback` when absent.
Result<int> optional_int(const GgufFile& file, const std::string& key, int fallback) {
  if (file.find(key) == nullptr) return fallback;
  return positive_int(file, key);
}

// The window and its per-layer list agree with each other and with the layer count.
Status validate_sliding_window(const ModelShape& s) {
  const SlidingWindowConfig& w = s.sliding_window;
  if (w.window == 0) {
    if (!w.local_layers.empty()) {
      return Status::errorf("model shape {}: {} local-layer entries but no sliding window", s.name,
                            w.local_layers.size());
    }
    return Status::ok_status();
  }
  if (w.window < 0 || w.window > kMaxContext) {
    return Status::errorf("model shape {}: sliding window = {} must be in [1, {}]", s.name, w.window, kMaxContext);
  }
  if (w.local_layers.size() != static_cast<size_t>(s.num_layers)) {
    return Status::errorf("model shape {}: sliding window has {} local-layer entries for {} layers", s.name,
                          w.local_layers.size(), s.num_layers);
  }
  for (size_t l = 0; l < w.local_layers.size(); ++l) {
    if (w.local_layers[l] > 1) {
      return Status::errorf("model shape {}: local-layer entry {} = {} must be 0 or 1", s.name, l, w.local_layers[l]);
    }
  }
  if (w.num_local_layers() == 0) {
    return Status::errorf("model shape {}: sliding window {} names no local layer", s.name, w.window);
  }
  return Status::ok_status();
}

}  // namespace

Status validate_model_shape(const ModelShape& s) {
  auto bad = [&](std::string_view field, int64_t value, int64_t max) {
    return Status::errorf("model shape {}: {} = {} must be in [1, {}]", s.name, field, value, max);
  };
  if (s.num_layers <= 0 || s.num_layers > kMaxLayers) return bad("layers", s.num_layers, kMaxLayers);
  if (s.num_heads <= 0 || s.num_heads > kMaxHeads) return bad("heads", s.num_heads, kMaxHeads);
  if (s.num_kv_heads <= 0 || s.num_kv_heads > s.num_heads) return bad("kv heads", s.num_kv_heads, s.num_heads);
  if (s.num_heads % s.num_kv_heads != 0) {
    return Status::errorf("model shape {}: heads {} is not a multiple of kv heads {}", s.name, s.num_heads,
                          s.num_kv_heads);
  }
  if (s.head_dim <= 0 || s.head_dim > kMaxHeadDim) return bad("head dim", s.head_dim, kMaxHeadDim);
  if (s.v_head_dim <= 0 || s.v_head_dim > kMaxHeadDim) return bad("v head dim", s.v_head_dim, kMaxHeadDim);
  if (s.context_length <= 0 || s.context_length > kMaxContext) {
    return bad("context length", s.context_length, kMaxContext);
  }
  if (s.kv_lora_rank < 0 || s.kv_lora_rank > kMaxHeadDim) return bad("kv lora rank", s.kv_lora_rank, kMaxHeadDim);
  if (s.rope_head_dim < 0 || s.rope_head_dim > kMaxHeadDim) {
    return bad("rope dim", s.rope_head_dim, kMaxHeadDim);
  }
  if (s.rope_head_dim > 0 && s.kv_lora_rank == 0) {
    return Status::errorf("model shape {}: rope dim {} is only meaningful with a kv lora rank (MLA)", s.name,
                          s.rope_head_dim);
  }
  if (!(s.num_params >= 0) || s.num_params > 1e15) {
    return Status::errorf("model shape {}: params {} must be in [0, 1e15]", s.name, s.num_params);
  }
  return validate_sliding_window(s);
}

std::string global_layer_list(const ModelShape& shape) {
  constexpr int kShown = 16;
  std::string out;
  int num_global = 0;
  for (int l = 0; l < shape.num_layers; ++l) {
    if (shape.sliding_window.is_local(l)) continue;
    if (num_global++ < kShown) out += fmt::format("{}{}", out.empty() ? "" : ", ", l);
  }
  if (num_global > kShown) out += fmt::format(" and {} more", num_global - kShown);
  return num_global == 0 ? "none" : out;
}

std::string local_layer_saving(const ModelShape& shape, int64_t tokens) {
  if (!shape.has_local_layers()) return "";
  // 32768 -> "32,768"
  std::string digits = std::to_string(tokens), grouped;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) grouped += ',';
    grouped += digits[i];
  }
  return fmt::format("local layers: {} of {} at window {}: {:.0f}% of the full cache saved at {} tokens",
                     shape.num_local_layers(), shape.num_layers, shape.sliding_window.window,
                     100.0 * (1.0 - shape.kept_fraction(tokens)), grouped);
}

std::span<const ModelShape> model_presets() { return presets(); }

Result<ModelShape> find_preset(std::string_view name) {
  const std::string wanted = lower(name);
  for (const ModelShape& s : presets()) {
    if (s.name == wanted) return s;
  }
  return Status::errorf("unknown preset '{}' (presets: {})", name, preset_list());
}

std::string preset_list() {
  std::string names;
  for (const ModelShape& s : presets()) names += (names.empty() ? "" : ", ") + s.name;
  return names;
}

Result<ModelShape> read_model_shape(const GgufFile& file) {
  ModelShape s;
  s.name = std::filesystem::path(file.name()).filename().string();
  KVLM_ASSIGN_OR_RETURN(s.architecture, file.get_string("general.architecture"));
  const std::string a = s.architecture + ".";
  KVLM_ASSIGN_OR_RETURN(s.num_layers, positive_int(file, a + "block_count"));
  KVLM_ASSIGN_OR_RETURN(s.num_heads, positive_int(file, a + "attention.head_count"));
  KVLM_ASSIGN_OR_RETURN(s.num_kv_heads, optional_int(file, a + "attention.head_count_kv", s.num_heads));
  KVLM_ASSIGN_OR_RETURN(const int64_t context, file.get_int(a + "context_length"));
  s.context_length = context;
  int default_head_dim = 0;
  if (file.find(a + "embedding_length") != nullptr) {
    KVLM_ASSIGN_OR_RETURN(const int dim, positive_int(file, a + "embedding_length"));
    default_head_dim = dim / s.num_heads;
  }
  KVLM_ASSIGN_OR_RETURN(s.head_dim, optional_int(file, a + "attention.key_length", default_head_dim));
  KVLM_ASSIGN_OR_RETURN(s.v_head_dim, optional_int(file, a + "attention.value_length", s.head_dim));

  if (file.find(a + "attention.kv_lora_rank") != nullptr) {
    KVLM_ASSIGN_OR_RETURN(s.kv_lora_rank, positive_int(file, a + "attention.kv_lora_rank"));
    KVLM_ASSIGN_OR_RETURN(s.rope_head_dim, optional_int(file, a + "rope.dimension_count", 0));
    // Newer llama.cpp conversions store the latent as one "kv head" (head_count_kv 1, key_length
    // kv_lora_rank + rope) and move the per-head sizes to *_mla keys; older ones keep per-head
    // sizes in key_length/value_length. Either way the MHA-equivalent cache has num_heads heads.
    KVLM_ASSIGN_OR_RETURN(s.head_dim, optional_int(file, a + "attention.key_length_mla", s.head_dim));
    KVLM_ASSIGN_OR_RETURN(s.v_head_dim, optional_int(file, a + "attention.value_length_mla", s.v_head_dim));
    s.num_kv_heads = s.num_heads;
  }
  if (s.head_dim == 0) {
    return Status::errorf("{}: neither {}attention.key_length nor {}embedding_length is present", file.name(), a, a);
  }
  // A window kvlm refuses (a non-gemma3 file that names one, a gemma3 file without one) is a
  // reason the model will not run, not one to hide its shape: planned as a full cache, said so.
  if (Result<SlidingWindowConfig> window = read_sliding_window(file, s.architecture, s.num_layers); window.ok()) {
    s.sliding_window = std::move(*window);
  } else {
    s.warnings.push_back(fmt::format("sliding window not applied, every layer planned as global: {}",
                                     window.status().message()));
  }

  double params = 0;
  uint64_t bytes = 0;
  for (const GgufTensorInfo& t : file.tensors()) {
    params += static_cast<double>(t.num_elements());
    bytes += t.num_bytes;
  }
  s.num_params = params;
  s.weight_bytes = bytes;
  KVLM_RETURN_IF_ERROR(validate_model_shape(s));
  return s;
}

Result<ModelShape> load_model_shape(const std::string& path) {
  KVLM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::open(path));
  return read_model_shape(*file);
}

ModelShape model_shape_from_config(const ModelConfig& c) {
  ModelShape shape;
  shape.name = c.name.empty() ? c.architecture : c.name;
  shape.architecture = c.architecture;
  shape.num_layers = c.num_layers;
  shape.num_heads = c.num_heads;
  shape.num_kv_heads = c.num_kv_heads;
  shape.head_dim = c.head_dim;
  shape.v_head_dim = c.head_dim;
  shape.context_length = c.context_length;
  shape.sliding_window = c.sliding_window;
  if (c.is_mla()) {  // the MHA-equivalent heads beside the latent the cache really holds
    shape.num_kv_heads = c.num_heads;
    shape.head_dim = c.mla.qk_head_dim();
    shape.v_head_dim = c.mla.v_head_dim;
    shape.kv_lora_rank = c.mla.kv_lora_rank;
    shape.rope_head_dim = c.mla.qk_rope_dim;
  }
  return shape;
}

}  // namespace kvlm
