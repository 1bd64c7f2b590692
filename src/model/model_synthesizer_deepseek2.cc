#include "model/model_synthesizer_deepseek2.h"

#include <cmath>

#include "gguf/gguf_writer.h"
#include "model/deepseek2_gguf_names.h"
#include "model/llama_gguf_names.h"
#include "model/synth_tensor_generator.h"

namespace kvlm::synth_internal {
namespace {

namespace names = llama_names;
namespace ds = deepseek2_names;

Status check_range(const char* field, int64_t value, int64_t min, int64_t max) {
  if (value < min || value > max) {
    return Status::errorf("synth shape: {} = {} is out of range [{}, {}]", field, value, min, max);
  }
  return Status::ok_status();
}

std::string key(const char* suffix) { return names::key(ds::kArchitecture, suffix); }

bool is_moe_layer(const SynthShape& s, int layer) { return s.num_experts > 0 && layer >= s.leading_dense_layers; }

}  // namespace

Status validate_deepseek2_shape(const SynthShape& s) {
  if (s.kv_lora_rank <= 0) {
    return Status::errorf("synth shape: deepseek2 needs kv_lora_rank > 0 (got {}): MLA's latent width", s.kv_lora_rank);
  }
  KVLM_RETURN_IF_ERROR(check_range("kv_lora_rank", s.kv_lora_rank, 1, 1 << 16));
  KVLM_RETURN_IF_ERROR(check_range("q_lora_rank", s.q_lora_rank, 0, 1 << 16));
  KVLM_RETURN_IF_ERROR(check_range("qk_nope_dim", s.qk_nope_dim, 1, 1024));
  KVLM_RETURN_IF_ERROR(check_range("qk_rope_dim", s.qk_rope_dim, 2, 1024));
  KVLM_RETURN_IF_ERROR(check_range("v_head_dim", s.v_head_dim, 1, 1024));
  if (s.qk_rope_dim % 2 != 0) {
    return Status::errorf("synth shape: qk_rope_dim = {} must be even for RoPE", s.qk_rope_dim);
  }
  if (s.num_kv_heads != s.num_heads) {
    return Status::errorf("synth shape: deepseek2 num_kv_heads = {} must equal num_heads = {} (MLA: every head "
                          "reads the one latent)",
                          s.num_kv_heads, s.num_heads);
  }
  if (s.head_dim != s.qk_nope_dim + s.qk_rope_dim) {
    return Status::errorf("synth shape: deepseek2 head_dim = {} must be qk_nope_dim + qk_rope_dim = {}", s.head_dim,
                          s.qk_nope_dim + s.qk_rope_dim);
  }
  if (s.qkv_bias) return Status::error("synth shape: qkv_bias is not a deepseek2 feature");
  if (s.rope_scaling.type.starts_with("llama3")) {
    return Status::errorf("synth shape: rope scaling '{}' is not a deepseek2 feature (none, linear, yarn)",
                          s.rope_scaling.type);
  }

  KVLM_RETURN_IF_ERROR(check_range("leading_dense_layers", s.leading_dense_layers, 0, s.num_layers));
  KVLM_RETURN_IF_ERROR(check_range("num_experts", s.num_experts, 0, 1 << 12));
  if (s.num_experts == 0) {
    if (s.leading_dense_layers != s.num_layers) {
      return Status::errorf("synth shape: num_experts = 0 needs leading_dense_layers = num_layers = {} (got {}): "
                            "every layer is dense",
                            s.num_layers, s.leading_dense_layers);
    }
    if (s.num_experts_used != 0 || s.num_shared_experts != 0 || s.expert_ffn_dim != 0) {
      return Status::errorf("synth shape: num_experts = 0 but num_experts_used = {}, num_shared_experts = {}, "
                            "expert_ffn_dim = {} (all must be 0)",
                            s.num_experts_used, s.num_shared_experts, s.expert_ffn_dim);
    }
  } else {
    if (s.leading_dense_layers >= s.num_layers) {
      return Status::errorf("synth shape: leading_dense_layers = {} leaves no MoE layer of {} for num_experts = {}",
                            s.leading_dense_layers, s.num_layers, s.num_experts);
    }
    if (s.num_experts_used < 1 || s.num_experts_used > s.num_experts) {
      return Status::errorf("synth shape: num_experts_used = {} is out of range [1, num_experts = {}]",
                            s.num_experts_used, s.num_experts);
    }
    KVLM_RETURN_IF_ERROR(check_range("num_shared_experts", s.num_shared_experts, 0, 64));
    KVLM_RETURN_IF_ERROR(check_range("expert_ffn_dim", s.expert_ffn_dim, 1, 1 << 20));
  }
  if (s.expert_gating != SynthExpertGating::kSoftmax && s.expert_gating != SynthExpertGating::kSigmoid) {
    return Status::errorf("synth shape: expert_gating = {} is neither softmax (1) nor sigmoid (2)",
                          static_cast<int>(s.expert_gating));
  }
  if (s.expert_bias && s.expert_gating != SynthExpertGating::kSigmoid) {
    return Status::error("synth shape: expert_bias (exp_probs_b) belongs to sigmoid expert_gating, not softmax");
  }
  if (s.expert_bias && s.num_experts == 0) return Status::error("synth shape: expert_bias needs num_experts > 0");
  if (!(s.expert_weights_scale > 0.0f) || !std::isfinite(s.expert_weights_scale)) {
    return Status::errorf("synth shape: expert_weights_scale = {} must be positive and finite", s.expert_weights_scale);
  }
  const float log_mul = s.rope_scaling.yarn_log_multiplier;
  if (!(log_mul >= 0.0f) || !std::isfinite(log_mul)) {
    return Status::errorf("synth shape: yarn_log_multiplier = {} must be >= 0 and finite", log_mul);
  }
  if (log_mul != 0.0f && s.rope_scaling.type != "yarn") {
    return Status::errorf("synth shape: yarn_log_multiplier = {} needs rope scaling 'yarn', not '{}'", log_mul,
                          s.rope_scaling.type);
  }
  return Status::ok_status();
}

Status check_no_deepseek2_fields(const SynthShape& s) {
  const SynthShape d;  // the defaults
  auto error = [&](const char* field, auto value) {
    return Status::errorf("synth shape: {} = {} is a deepseek2 field, not {}'s", field, value, s.architecture);
  };
  if (s.q_lora_rank != d.q_lora_rank) return error("q_lora_rank", s.q_lora_rank);
  if (s.kv_lora_rank != d.kv_lora_rank) return error("kv_lora_rank", s.kv_lora_rank);
  if (s.qk_nope_dim != d.qk_nope_dim) return error("qk_nope_dim", s.qk_nope_dim);
  if (s.qk_rope_dim != d.qk_rope_dim) return error("qk_rope_dim", s.qk_rope_dim);
  if (s.v_head_dim != d.v_head_dim) return error("v_head_dim", s.v_head_dim);
  if (s.mla_layout != d.mla_layout) return error("mla_layout", "split");
  if (s.leading_dense_layers != d.leading_dense_layers) return error("leading_dense_layers", s.leading_dense_layers);
  if (s.num_experts != d.num_experts) return error("num_experts", s.num_experts);
  if (s.num_experts_used != d.num_experts_used) return error("num_experts_used", s.num_experts_used);
  if (s.num_shared_experts != d.num_shared_experts) return error("num_shared_experts", s.num_shared_experts);
  if (s.expert_ffn_dim != d.expert_ffn_dim) return error("expert_ffn_dim", s.expert_ffn_dim);
  if (s.expert_gating != d.expert_gating) return error("expert_gating", "sigmoid");
  if (s.expert_weights_norm != d.expert_weights_norm) return error("expert_weights_norm", "true");
  if (s.expert_weights_scale != d.expert_weights_scale) return error("expert_weights_scale", s.expert_weights_scale);
  if (s.expert_bias != d.expert_bias) return error("expert_bias", "true");
  if (s.rope_scaling.yarn_log_multiplier != d.rope_scaling.yarn_log_multiplier) {
    return error("yarn_log_multiplier", s.rope_scaling.yarn_log_multiplier);
  }
  return Status::ok_status();
}

int64_t deepseek2_num_parameters(const SynthShape& s) {
  const int64_t d = s.dim, heads = s.num_heads, nope = s.qk_nope_dim, rope = s.qk_rope_dim, v = s.v_head_dim;
  const int64_t kv = s.kv_lora_rank, q = s.q_lora_rank, q_rows = heads * (nope + rope);
  const int64_t attention = 2 * d                                                 // attn_norm, ffn_norm
                            + (q > 0 ? d * q + q + q * q_rows : d * q_rows)       // q_a, q_a_norm, q_b | q
                            + d * (kv + rope) + kv                                // kv_a_mqa, kv_a_norm
                            + kv * heads * (nope + v)                             // kv_b (= k_b + v_b)
                            + heads * v * d;                                      // output
  const int64_t dense_ffn = 3 * d * s.ffn_dim;
  const int64_t e = s.num_experts, f = s.expert_ffn_dim;
  const int64_t moe_ffn = d * e + 3 * d * f * e + 3 * d * f * s.num_shared_experts + (s.expert_bias ? e : 0);
  int64_t total = int64_t{s.vocab_size} * d * (s.tied_output ? 1 : 2) + d;
  for (int l = 0; l < s.num_layers; ++l) total += attention + (is_moe_layer(s, l) ? moe_ffn : dense_ffn);
  return total;
}

void add_deepseek2_metadata(GgufWriter& w, const SynthShape& s) {
  const auto u32 = [](int v) { return static_cast<uint32_t>(v); };
  if (s.mla_layout == SynthMlaLayout::kSplit) {
    w.set_u32(key(names::kHeadCountKv), 1);
    w.set_u32(key(names::kKeyLength), u32(s.kv_lora_rank + s.qk_rope_dim));
    w.set_u32(key(names::kValueLength), u32(s.kv_lora_rank));
    w.set_u32(key(ds::kKeyLengthMla), u32(s.qk_nope_dim + s.qk_rope_dim));
    w.set_u32(key(ds::kValueLengthMla), u32(s.v_head_dim));
  } else {
    w.set_u32(key(names::kHeadCountKv), u32(s.num_heads));
    w.set_u32(key(names::kKeyLength), u32(s.qk_nope_dim + s.qk_rope_dim));
    w.set_u32(key(names::kValueLength), u32(s.v_head_dim));
  }
  w.set_u32(key(names::kRopeDimensionCount), u32(s.qk_rope_dim));
  if (s.q_lora_rank > 0) w.set_u32(key(ds::kQLoraRank), u32(s.q_lora_rank));
  w.set_u32(key(ds::kKvLoraRank), u32(s.kv_lora_rank));
  w.set_u32(key(ds::kLeadingDenseBlockCount), u32(s.leading_dense_layers));
  w.set_u32(key(ds::kExpertFeedForwardLength), u32(s.expert_ffn_dim));
  w.set_u32(key(ds::kExpertCount), u32(s.num_experts));
  w.set_u32(key(ds::kExpertUsedCount), u32(s.num_experts_used));
  w.set_u32(key(ds::kExpertSharedCount), u32(s.num_shared_experts));
  w.set_f32(key(ds::kExpertWeightsScale), s.expert_weights_scale);
  w.set_bool(key(ds::kExpertWeightsNorm), s.expert_weights_norm);
  w.set_u32(key(ds::kExpertGatingFunc), static_cast<uint32_t>(s.expert_gating));
  if (s.rope_scaling.yarn_log_multiplier != 0.0f) {
    w.set_f32(key(ds::kRopeYarnLogMultiplier), s.rope_scaling.yarn_log_multiplier);
  }
}

void add_deepseek2_layers(SynthTensorGenerator& gen, const SynthShape& s) {
  const auto fan_in_std = [](int64_t fan_in) { return 1.0f / std::sqrt(static_cast<float>(fan_in)); };
  // As for the llama family: 2 * num_layers residual branches, each scaled so the stream's rms stays ~1.
  const auto residual_std = [&](int64_t fan_in) { return fan_in_std(fan_in * 2 * s.num_layers); };
  const Distribution norm{1.0f, 0.02f};
  // The router's logits spread by ~3 so the top-k choice is rarely a near tie (where two engines'
  // f32 rounding would pick different experts; a quantized file's larger changes still flip some).
  const Distribution router{0.0f, 3.0f * fan_in_std(s.dim)};
  const Distribution expert_bias{0.0f, 0.1f};
  const int64_t d = s.dim, heads = s.num_heads, nope = s.qk_nope_dim, rope = s.qk_rope_dim, v = s.v_head_dim;
  const int64_t kv = s.kv_lora_rank, q_rows = heads * (nope + rope);

  for (int l = 0; l < s.num_layers; ++l) {
    const auto blk = [l](const char* name) { return names::blk(l, name); };
    gen.vector(blk(names::kAttnNorm), d, norm);
    if (s.q_lora_rank > 0) {
      gen.matrix(blk(ds::kAttnQA), s.q_lora_rank, d, {0.0f, fan_in_std(d)});
      gen.vector(blk(ds::kAttnQANorm), s.q_lora_rank, norm);
      gen.matrix(blk(ds::kAttnQB), q_rows, s.q_lora_rank, {0.0f, fan_in_std(s.q_lora_rank)});
    } else {
      gen.matrix(blk(names::kAttnQ), q_rows, d, {0.0f, fan_in_std(d)});
    }
    gen.matrix(blk(ds::kAttnKvAMqa), kv + rope, d, {0.0f, fan_in_std(d)});
    gen.vector(blk(ds::kAttnKvANorm), kv, norm);
    const Distribution kv_b{0.0f, fan_in_std(kv)};
    if (s.mla_layout == SynthMlaLayout::kSplit) {
      gen.split_kv_b({.kv_b_name = blk(ds::kAttnKvB),
                      .k_name = blk(ds::kAttnKB),
                      .v_name = blk(ds::kAttnVB),
                      .num_heads = heads,
                      .nope_dim = nope,
                      .v_dim = v,
                      .kv_lora_rank = kv},
                     kv_b);
    } else {
      gen.matrix(blk(ds::kAttnKvB), heads * (nope + v), kv, kv_b);
    }
    gen.matrix(blk(names::kAttnOutput), d, heads * v, {0.0f, residual_std(heads * v)});
    gen.vector(blk(names::kFfnNorm), d, norm);
    if (!is_moe_layer(s, l)) {
      gen.matrix(blk(names::kFfnGate), s.ffn_dim, d, {0.0f, fan_in_std(d)});
      gen.matrix(blk(names::kFfnUp), s.ffn_dim, d, {0.0f, fan_in_std(d)});
      gen.matrix(blk(names::kFfnDown), d, s.ffn_dim, {0.0f, residual_std(s.ffn_dim)});
      continue;
    }
    const int64_t e = s.num_experts, f = s.expert_ffn_dim;
    gen.f32_matrix(blk(ds::kFfnGateInp), e, d, router);
    if (s.expert_bias) gen.vector(blk(ds::kExpProbsBias), e, expert_bias);
    gen.stacked(blk(ds::kFfnGateExps), e, f, d, {0.0f, fan_in_std(d)});
    gen.stacked(blk(ds::kFfnUpExps), e, f, d, {0.0f, fan_in_std(d)});
    gen.stacked(blk(ds::kFfnDownExps), e, d, f, {0.0f, residual_std(f)});
    if (s.num_shared_experts > 0) {
      const int64_t shared = f * s.num_shared_experts;
      gen.matrix(blk(ds::kFfnGateShexp), shared, d, {0.0f, fan_in_std(d)});
      gen.matrix(blk(ds::kFfnUpShexp), shared, d, {0.0f, fan_in_std(d)});
      gen.matrix(blk(ds::kFfnDownShexp), d, shared, {0.0f, residual_std(shared)});
    }
  }
}

}  // namespace kvlm::synth_internal
