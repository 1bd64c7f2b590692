#include "model/deepseek2_config.h"

#include <cmath>
#include <string>

#include "gguf/gguf_file.h"
#include "model/deepseek2_gguf_names.h"
#include "model/llama_gguf_names.h"
#include "model/rope_scaling.h"

namespace kvlm {
namespace {

namespace names = llama_names;
namespace ds = deepseek2_names;

// "<arch>.<suffix>" as an integer in [lo, hi], or `fallback` when absent.
Result<int> optional_int(const GgufFile& file, const char* suffix, int fallback, int64_t lo, int64_t hi) {
  const std::string key = names::key(ds::kArchitecture, suffix);
  if (file.find(key) == nullptr) return fallback;
  KVLM_ASSIGN_OR_RETURN(int64_t v, file.get_int(key));
  if (v < lo || v > hi) return Status::errorf("{}: metadata '{}' = {} is out of range [{}, {}]", file.name(), key, v, lo, hi);
  return static_cast<int>(v);
}

Result<int> required_int(const GgufFile& file, const char* suffix, int64_t lo, int64_t hi) {
  const std::string key = names::key(ds::kArchitecture, suffix);
  if (file.find(key) == nullptr) return Status::errorf("{}: deepseek2 needs metadata '{}'", file.name(), key);
  return optional_int(file, suffix, 0, lo, hi);
}

Result<double> optional_float(const GgufFile& file, const char* suffix, double fallback) {
  const std::string key = names::key(ds::kArchitecture, suffix);
  if (file.find(key) == nullptr) return fallback;
  KVLM_ASSIGN_OR_RETURN(double v, file.get_float(key));
  if (!std::isfinite(v)) return Status::errorf("{}: metadata '{}' = {} is not finite", file.name(), key, v);
  return v;
}

// The sizes of a head: per-head key/value lengths in the older convention, the *_mla keys in
// the newer one (whose key/value_length describe the cached row and its value part).
Status read_mla_shapes(const GgufFile& file, ModelConfig& c) {
  MlaConfig& m = c.mla;
  const std::string kv_heads_key = names::key(ds::kArchitecture, names::kHeadCountKv);
  KVLM_ASSIGN_OR_RETURN(m.kv_lora_rank, required_int(file, ds::kKvLoraRank, 1, 1 << 14));
  KVLM_ASSIGN_OR_RETURN(m.q_lora_rank, optional_int(file, ds::kQLoraRank, 0, 0, 1 << 16));
  KVLM_ASSIGN_OR_RETURN(m.qk_rope_dim, required_int(file, names::kRopeDimensionCount, 2, 1024));
  if (m.qk_rope_dim % 2 != 0) {
    return Status::errorf("{}: '{}' = {} must be even", file.name(),
                          names::key(ds::kArchitecture, names::kRopeDimensionCount), m.qk_rope_dim);
  }
  KVLM_ASSIGN_OR_RETURN(int kv_heads, optional_int(file, names::kHeadCountKv, c.num_heads, 1, 1024));
  KVLM_ASSIGN_OR_RETURN(int key_length, required_int(file, names::kKeyLength, 1, 1 << 15));
  KVLM_ASSIGN_OR_RETURN(int value_length, required_int(file, names::kValueLength, 1, 1 << 15));
  const bool mqa_view = file.find(names::key(ds::kArchitecture, ds::kKeyLengthMla)) != nullptr ||
                        file.find(names::key(ds::kArchitecture, ds::kValueLengthMla)) != nullptr;
  int qk_head = key_length;
  int v_head = value_length;
  if (mqa_view) {
    KVLM_ASSIGN_OR_RETURN(qk_head, required_int(file, ds::kKeyLengthMla, 1, 1024));
    KVLM_ASSIGN_OR_RETURN(v_head, required_int(file, ds::kValueLengthMla, 1, 1024));
    if (kv_heads != 1 || key_length != m.row_dim() || value_length != m.kv_lora_rank) {
      return Status::errorf(
          "{}: with '{}' the cache is one latent row: expected head_count_kv 1, key_length {} (kv_lora_rank + rope) "
          "and value_length {} (kv_lora_rank), the file has {}, {} and {}",
          file.name(), names::key(ds::kArchitecture, ds::kKeyLengthMla), m.row_dim(), m.kv_lora_rank, kv_heads,
          key_length, value_length);
    }
  } else if (kv_heads != c.num_heads) {
    return Status::errorf("{}: '{}' = {} with per-head key_length {}: deepseek2 without '{}' needs head_count_kv = "
                          "head_count ({})",
                          file.name(), kv_heads_key, kv_heads, key_length,
                          names::key(ds::kArchitecture, ds::kKeyLengthMla), c.num_heads);
  }
  m.qk_nope_dim = qk_head - m.qk_rope_dim;
  m.v_head_dim = v_head;
  if (m.qk_nope_dim <= 0) {
    return Status::errorf("{}: key length per head {} leaves no dims beside the {} RoPE dims", file.name(), qk_head,
                          m.qk_rope_dim);
  }
  m.split_kv_b = file.find_tensor(names::blk(0, ds::kAttnKB)) != nullptr &&
                 file.find_tensor(names::blk(0, ds::kAttnVB)) != nullptr;
  c.num_kv_heads = 1;
  c.head_dim = m.row_dim();
  return Status::ok_status();
}

Status read_moe(const GgufFile& file, ModelConfig& c) {
  MoeConfig& e = c.moe;
  KVLM_ASSIGN_OR_RETURN(e.num_experts, optional_int(file, ds::kExpertCount, 0, 0, 1 << 12));
  KVLM_ASSIGN_OR_RETURN(e.leading_dense_layers,
                        optional_int(file, ds::kLeadingDenseBlockCount, 0, 0, c.num_layers));
  if (!e.enabled()) return Status::ok_status();
  const std::string used_key = names::key(ds::kArchitecture, ds::kExpertUsedCount);
  KVLM_ASSIGN_OR_RETURN(e.num_experts_used, required_int(file, ds::kExpertUsedCount, 1, e.num_experts));
  KVLM_ASSIGN_OR_RETURN(e.num_shared_experts, optional_int(file, ds::kExpertSharedCount, 0, 0, 1 << 10));
  KVLM_ASSIGN_OR_RETURN(e.expert_ffn_dim, required_int(file, ds::kExpertFeedForwardLength, 1, 1 << 20));
  KVLM_ASSIGN_OR_RETURN(double scale, optional_float(file, ds::kExpertWeightsScale, 1.0));
  // Some converters write 0 for "no scaling".
  e.weights_scale = scale == 0.0 ? 1.0f : static_cast<float>(scale);
  if (const std::string key = names::key(ds::kArchitecture, ds::kExpertWeightsNorm); file.find(key) != nullptr) {
    KVLM_ASSIGN_OR_RETURN(e.normalize_weights, file.get_bool(key));
  }
  // Files from before the key route by softmax (DeepSeek-V2); V3's sigmoid is always written.
  KVLM_ASSIGN_OR_RETURN(int gating, optional_int(file, ds::kExpertGatingFunc, ds::kGatingSoftmax, 0, 1 << 20));
  if (gating == 0) gating = ds::kGatingSoftmax;  // "none" in the enum: the default
  if (gating == static_cast<int>(ds::kGatingSoftmax)) {
    e.gating = ExpertGating::kSoftmax;
  } else if (gating == static_cast<int>(ds::kGatingSigmoid)) {
    e.gating = ExpertGating::kSigmoid;
  } else {
    return Status::errorf("{}: '{}' = {} is not a gating function kvlm knows (1 softmax, 2 sigmoid)", file.name(),
                          names::key(ds::kArchitecture, ds::kExpertGatingFunc), gating);
  }
  e.has_expert_bias = file.find_tensor(names::blk(e.leading_dense_layers, ds::kExpProbsBias)) != nullptr;
  KVLM_ASSIGN_OR_RETURN(e.num_groups, optional_int(file, ds::kExpertGroupCount, 1, 0, e.num_experts));
  KVLM_ASSIGN_OR_RETURN(e.num_groups_used, optional_int(file, ds::kExpertGroupUsedCount, e.num_groups, 0, e.num_experts));
  if (e.num_groups == 0) e.num_groups = 1;
  if (e.num_groups_used == 0) e.num_groups_used = e.num_groups;
  if (e.num_experts % e.num_groups != 0 || e.num_groups_used > e.num_groups ||
      (e.num_groups > 1 && e.num_groups_used * (e.num_experts / e.num_groups) < e.num_experts_used)) {
    return Status::errorf("{}: {} experts in '{}' = {} groups of which '{}' = {} are used cannot give {} experts",
                          file.name(), e.num_experts, names::key(ds::kArchitecture, ds::kExpertGroupCount), e.num_groups,
                          names::key(ds::kArchitecture, ds::kExpertGroupUsedCount), e.num_groups_used,
                          e.num_experts_used);
  }
  return Status::ok_status();
}

}  // namespace

Status read_deepseek2_config(const GgufFile& file, ModelConfig& c) {
  KVLM_RETURN_IF_ERROR(read_mla_shapes(file, c));
  KVLM_RETURN_IF_ERROR(read_moe(file, c));
  const MlaConfig& m = c.mla;
  // The RoPE key is its own small vector, rotated in adjacent pairs (the converter keeps
  // DeepSeek's interleaved layout).
  KVLM_ASSIGN_OR_RETURN(RopeConfig rope,
                        read_rope_config(file, ds::kArchitecture, m.qk_rope_dim, m.qk_rope_dim, RopeStyle::kNormal));
  c.rope = std::move(rope.params);
  c.rope_scaling = rope.scaling;
  c.rope_scaling_factor = rope.scaling_factor;
  double scale = 1.0 / std::sqrt(static_cast<double>(m.qk_head_dim()));
  if (c.rope_scaling == RopeScalingKind::kYarn) {
    // DeepSeek's YaRN leaves cos and sin unscaled and multiplies q·k by mscale² instead,
    // mscale = 1 + yarn_log_multiplier ln(factor) (0.1 × mscale_all_dim in the HF config).
    KVLM_ASSIGN_OR_RETURN(double log_mul, optional_float(file, ds::kRopeYarnLogMultiplier, 0.0));
    const double factor = c.rope_scaling_factor;
    const double mscale = c.rope.yarn.attn_factor * (1.0 + log_mul * std::log(factor));
    c.rope.yarn.attn_factor = static_cast<float>(1.0 / (1.0 + 0.1 * std::log(factor)));
    c.mla.yarn_mscale = static_cast<float>(mscale);
    scale *= mscale * mscale;
  } else if (c.rope_scaling != RopeScalingKind::kNone) {
    return Status::errorf("{}: deepseek2 with rope scaling '{}' is not supported (none or yarn)", file.name(),
                          rope_scaling_kind_name(c.rope_scaling));
  }
  c.attention_scale = static_cast<float>(scale);
  return Status::ok_status();
}

}  // namespace kvlm
