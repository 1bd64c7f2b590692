#include "model/model_config.h"

#include <array>
#include <cmath>
#include <string_view>

#include "gguf/gguf_file.h"
#include "model/deepseek2_config.h"
#include "model/llama_gguf_names.h"

namespace kvlm {
namespace {

namespace names = llama_names;

// Architectures that share the llama block; qwen2 adds Q/K/V biases and NeoX-style RoPE,
// qwen3 drops the biases for a per-head RMSNorm of q and k.
// gemma3 adds q/k norms too, post-norms, GELU, a scaled embedding and sliding-window layers.
// phi3 is the llama block with q/k/v and gate/up each in one tensor, and NeoX RoPE.
// deepseek2 is multi-head latent attention with mixture-of-experts FFNs (deepseek2_config.h).
constexpr std::array<std::string_view, 7> kSupportedArchitectures = {"llama",  "mistral", "qwen2",    "qwen3",
                                                                     "gemma3", "phi3",    "deepseek2"};

// Gemma 3's query_pre_attn_scalar is not in its GGUF files: it is head_dim for every size
// but 27B (62 layers), whose 168 = dim / heads (5376 / 32), the rule llama.cpp applies too.
float gemma3_attention_scale(const ModelConfig& c) {
  constexpr int kGemma3_27bLayers = 62;
  const double scalar = c.num_layers == kGemma3_27bLayers ? static_cast<double>(c.dim) / c.num_heads : c.head_dim;
  return static_cast<float>(1.0 / std::sqrt(scalar));
}

// Reads a positive integer hyper-parameter "<arch>.<suffix>" bounded by `max`.
Result<int> read_dimension(const GgufFile& file, const std::string& arch, const char* suffix, int64_t max) {
  const std::string key = names::key(arch, suffix);
  auto value = file.get_int(key);
  if (!value.ok()) return value.status();
  if (*value <= 0 || *value > max) {
    return Status::errorf("{}: metadata '{}' = {} is out of range [1, {}]", file.name(), key, *value, max);
  }
  return static_cast<int>(*value);
}

// Heads, RoPE and the per-architecture attention details of the llama-block architectures.
Status read_attention(const GgufFile& file, ModelConfig& c) {
  const std::string& arch = c.architecture;
  if (file.find(names::key(arch, names::kHeadCountKv)) != nullptr) {
    KVLM_ASSIGN_OR_RETURN(c.num_kv_heads, read_dimension(file, arch, names::kHeadCountKv, 1024));
  } else {
    c.num_kv_heads = c.num_heads;
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    return Status::errorf("{}: head_count {} is not a multiple of head_count_kv {}", file.name(), c.num_heads,
                          c.num_kv_heads);
  }
  if (file.find(names::key(arch, names::kKeyLength)) != nullptr) {
    KVLM_ASSIGN_OR_RETURN(c.head_dim, read_dimension(file, arch, names::kKeyLength, 1024));
    if (file.find(names::key(arch, names::kValueLength)) != nullptr) {
      KVLM_ASSIGN_OR_RETURN(int value_dim, read_dimension(file, arch, names::kValueLength, 1024));
      if (value_dim != c.head_dim) {
        return Status::errorf("{}: key_length {} != value_length {} is not supported", file.name(), c.head_dim,
                              value_dim);
      }
    }
  } else {
    if (c.dim % c.num_heads != 0) {
      return Status::errorf("{}: embedding_length {} is not a multiple of head_count {}", file.name(), c.dim,
                            c.num_heads);
    }
    c.head_dim = c.dim / c.num_heads;
  }
  if (c.head_dim % 2 != 0) return Status::errorf("{}: head dimension {} must be even for RoPE", file.name(), c.head_dim);

  int rotary_dim = c.head_dim;
  if (file.find(names::key(arch, names::kRopeDimensionCount)) != nullptr) {
    KVLM_ASSIGN_OR_RETURN(rotary_dim, read_dimension(file, arch, names::kRopeDimensionCount, c.head_dim));
    if (rotary_dim % 2 != 0) return Status::errorf("{}: rope.dimension_count must be even", file.name());
  }
  const bool gemma3 = arch == "gemma3";
  const bool phi3 = arch == "phi3";
  const RopeStyle style =
      arch == "qwen2" || arch == "qwen3" || gemma3 || phi3 ? RopeStyle::kNeox : RopeStyle::kNormal;
  if (phi3 && (file.find_tensor(names::kRopeFactorsLong) != nullptr ||
               file.find_tensor(names::kRopeFactorsShort) != nullptr)) {
    return Status::errorf("{}: phi3 LongRoPE ({} / {}, the 128k-context files) is not supported", file.name(),
                          names::kRopeFactorsLong, names::kRopeFactorsShort);
  }
  KVLM_ASSIGN_OR_RETURN(RopeConfig rope, read_rope_config(file, arch, c.head_dim, rotary_dim, style));
  c.rope = std::move(rope.params);
  c.rope_scaling = rope.scaling;
  c.rope_scaling_factor = rope.scaling_factor;
  c.has_qkv_bias = file.find_tensor(names::blk(0, names::kAttnQBias)) != nullptr;
  c.fused_qkv = file.find_tensor(names::blk(0, names::kAttnQkv)) != nullptr;
  c.fused_gate_up = phi3;
  c.has_qk_norm = arch == "qwen3" || gemma3;
  c.attention_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  KVLM_ASSIGN_OR_RETURN(c.sliding_window, read_sliding_window(file, arch, c.num_layers));
  if (const GgufValue* window = file.find(names::key(arch, names::kSlidingWindow)); phi3 && window != nullptr) {
    c.warnings.push_back(fmt::format("'{}' = {} is not applied: every phi3 layer attends to the whole context, as "
                                     "in llama.cpp",
                                     names::key(arch, names::kSlidingWindow), window->to_display_string()));
  }
  if (gemma3) {
    c.embedding_scale = std::sqrt(static_cast<float>(c.dim));
    c.has_post_norms = true;
    c.ffn_activation = FfnActivation::kGeluTanh;
    c.attention_scale = gemma3_attention_scale(c);
    // Local layers rotate with their own base (10,000 unless the file says) and no scaling.
    c.local_rope = RopeParams{};
    c.local_rope.head_dim = c.head_dim;
    c.local_rope.rotary_dim = rotary_dim;
    c.local_rope.style = style;
    c.local_rope.freq_base = 10000.0f;
    if (const GgufValue* base = file.find(names::key(arch, names::kRopeFreqBaseSwa)); base != nullptr) {
      const std::optional<double> b = base->as_float();
      if (!b || !(*b > 0.0) || !std::isfinite(*b)) {
        return Status::errorf("{}: metadata '{}' = {} must be a positive number", file.name(),
                              names::key(arch, names::kRopeFreqBaseSwa), base->to_display_string());
      }
      c.local_rope.freq_base = static_cast<float>(*b);
    }
  }
  return Status::ok_status();
}

}  // namespace

const char* expert_gating_name(ExpertGating gating) {
  return gating == ExpertGating::kSigmoid ? "sigmoid" : "softmax";
}

KvLayout ModelConfig::kv_layout(int block_size) const {
  KvLayout layout{num_layers, num_kv_heads, head_dim, block_size};
  if (is_mla()) layout.latent_value_dim = mla.kv_lora_rank;
  return layout;
}

std::string ModelConfig::attention_kind() const {
  if (is_mla()) return "MLA";
  if (num_kv_heads == num_heads) return "MHA";
  if (num_kv_heads == 1) return "MQA";
  return "GQA";
}

Result<ModelConfig> ModelConfig::from_gguf(const GgufFile& file) {
  ModelConfig c;
  KVLM_ASSIGN_OR_RETURN(c.architecture, file.get_string(names::kArchitecture));
  bool supported = false;
  for (std::string_view a : kSupportedArchitectures) supported |= (a == c.architecture);
  if (!supported) {
    return Status::errorf("{}: architecture '{}' is not supported (supported: llama, mistral, qwen2, qwen3, gemma3, phi3, deepseek2)", file.name(),
                          c.architecture);
  }
  if (auto name = file.get_string(names::kName); name.ok()) c.name = *name;
  const std::string& arch = c.architecture;

  // Bounds keep later size arithmetic far from overflow while allowing every real model.
  KVLM_ASSIGN_OR_RETURN(c.num_layers, read_dimension(file, arch, names::kBlockCount, 1024));
  KVLM_ASSIGN_OR_RETURN(c.dim, read_dimension(file, arch, names::kEmbeddingLength, 1 << 16));
  KVLM_ASSIGN_OR_RETURN(c.num_heads, read_dimension(file, arch, names::kHeadCount, 1024));
  KVLM_ASSIGN_OR_RETURN(c.ffn_dim, read_dimension(file, arch, names::kFeedForwardLength, 1 << 20));
  KVLM_ASSIGN_OR_RETURN(c.context_length, read_dimension(file, arch, names::kContextLength, 1 << 24));
  if (auto eps = file.get_float(names::key(arch, names::kRmsEps)); eps.ok()) c.rms_eps = static_cast<float>(*eps);
  if (arch == "deepseek2") {
    KVLM_RETURN_IF_ERROR(read_deepseek2_config(file, c));
  } else {
    KVLM_RETURN_IF_ERROR(read_attention(file, c));
  }
  c.tied_output = file.find_tensor(names::kOutput) == nullptr;

  const GgufTensorInfo* embd = file.find_tensor(names::kTokenEmbd);
  if (embd == nullptr) return Status::errorf("{}: missing tensor '{}'", file.name(), names::kTokenEmbd);
  if (embd->dims.size() != 2) return Status::errorf("{}: tensor '{}' must be 2-D", file.name(), names::kTokenEmbd);
  c.vocab_size = static_cast<int>(embd->dims[1]);
  if (auto vocab = file.get_int(names::key(arch, names::kVocabSize)); vocab.ok() && *vocab != c.vocab_size) {
    return Status::errorf("{}: vocab_size {} disagrees with token_embd rows {}", file.name(), *vocab, c.vocab_size);
  }
  return c;
}

}  // namespace kvlm
