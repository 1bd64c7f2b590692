#include "model/model_synthesizer.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/quantize.h"
#include "core/thread_pool.h"
#include "gguf/gguf_file_type.h"
#include "gguf/gguf_writer.h"
#include "model/llama_gguf_names.h"
#include "model/model_synthesizer_deepseek2.h"
#include "model/rope_scaling.h"
#include "model/synth_tensor_generator.h"
#include "model/synthetic_vocab.h"

namespace kvlm {
namespace {

namespace names = llama_names;
using synth_internal::Distribution;
using synth_internal::SynthTensorGenerator;

const Distribution kNorm{1.0f, 0.02f};  // norm weights: 1 + noise

struct NamedPreset {
  const char* name;
  SynthShape shape;
};

SynthShape make_shape(const char* arch, int layers, int dim, int heads, int kv_heads, int head_dim, int ffn, int vocab,
                      int context, float rope_base, float eps, bool tied, bool qkv_bias) {
  SynthShape s;
  s.architecture = arch;
  s.num_layers = layers;
  s.dim = dim;
  s.num_heads = heads;
  s.num_kv_heads = kv_heads;
  s.head_dim = head_dim;
  s.ffn_dim = ffn;
  s.vocab_size = vocab;
  s.context_length = context;
  s.rope_freq_base = rope_base;
  s.rms_eps = eps;
  s.tied_output = tied;
  s.qkv_bias = qkv_bias;
  return s;
}

// Llama 3.x's RoPE: frequency factors for an 8,192-token original context, as rope_freqs.
SynthShape llama3_scaled(SynthShape s, float factor) {
  s.rope_scaling.type = "llama3";
  s.rope_scaling.factor = factor;
  s.rope_scaling.original_context = 8192;
  return s;
}

SynthShape with_window(SynthShape s, int window) {
  s.sliding_window = window;
  return s;
}

// DeepSeek-V2's attention: per-head dims and the two latent ranks (q_lora 0: a plain attn_q).
struct MlaDims {
  int heads = 0;
  int q_lora = 0;
  int kv_lora = 0;
  int nope = 0;
  int rope = 0;
  int v = 0;
};

// A deepseek2 model whose every layer is dense (ffn), untied as DeepSeek-V2 is, stored with
// attn_kv_b; with_experts and the fields below make the rest.
SynthShape make_deepseek2(int layers, int dim, MlaDims mla, int ffn, int vocab, int context, float rope_base,
                          float eps) {
  SynthShape s = make_shape("deepseek2", layers, dim, mla.heads, mla.heads, mla.nope + mla.rope, ffn, vocab, context,
                            rope_base, eps, false, false);
  s.q_lora_rank = mla.q_lora;
  s.kv_lora_rank = mla.kv_lora;
  s.qk_nope_dim = mla.nope;
  s.qk_rope_dim = mla.rope;
  s.v_head_dim = mla.v;
  s.leading_dense_layers = layers;
  return s;
}

// Layers from leading_dense on are MoE: `used` of `experts` routed experts of width expert_ffn, plus `shared`.
SynthShape with_experts(SynthShape s, int leading_dense, int experts, int used, int shared, int expert_ffn) {
  s.leading_dense_layers = leading_dense;
  s.num_experts = experts;
  s.num_experts_used = used;
  s.num_shared_experts = shared;
  s.expert_ffn_dim = expert_ffn;
  return s;
}

// DeepSeek-V3's routing: sigmoid scores with a selection bias, renormalized, scaled.
SynthShape with_sigmoid_gating(SynthShape s, float scale) {
  s.expert_gating = SynthExpertGating::kSigmoid;
  s.expert_bias = true;
  s.expert_weights_norm = true;
  s.expert_weights_scale = scale;
  return s;
}

SynthShape with_split_kv_b(SynthShape s) {
  s.mla_layout = SynthMlaLayout::kSplit;
  return s;
}

SynthShape with_yarn(SynthShape s, float factor, int original_context, float log_multiplier) {
  s.rope_scaling.type = "yarn";
  s.rope_scaling.factor = factor;
  s.rope_scaling.original_context = original_context;
  s.rope_scaling.yarn_log_multiplier = log_multiplier;
  return s;
}

// DeepSeek-V2-Lite (15.7B parameters, 2.4B active): 27 layers, the first dense, then 64 experts
// (6 routed + 2 shared per token); no q bottleneck; YaRN 40x over 4k (mscale_all_dim 0.707 ->
// log multiplier 0.0707); written as newer converters write it (attn_k_b / attn_v_b).
SynthShape deepseek_v2_lite() {
  const MlaDims mla{.heads = 16, .q_lora = 0, .kv_lora = 512, .nope = 128, .rope = 64, .v = 128};
  return with_split_kv_b(with_yarn(with_experts(make_deepseek2(kDeepseek2LiteLayers, 2048, mla, 10944, 102400, 163840, 10000.0f, 1e-6f),
                                                1, 64, 6, 2, 1408),
                                   40.0f, 4096, 0.0707f));
}

// Tiny deepseek2 models: every matrix's rows fill Q8_0's 32-value blocks (so a Q8_0 file has no F32
// fallback), which is why the q bottleneck is 96 rather than 48 (attn_q_b's rows are q_lora long);
// dim 64, 4 heads, kv_lora = nope = v = 32, rope 16, dense ffn 128. 3 layers with a q bottleneck;
// without one, 27 (kDeepseek2LiteLayers): llama.cpp takes a file without attention.q_lora_rank for
// DeepSeek-V2-Lite only at the layer counts of the models that have none (27, and GigaChat3's 26),
// and at any other fails with "key not found in model: deepseek2.attention.q_lora_rank".
SynthShape deepseek2_tiny(int q_lora) {
  const MlaDims mla{.heads = 4, .q_lora = q_lora, .kv_lora = 32, .nope = 32, .rope = 16, .v = 32};
  return make_deepseek2(q_lora > 0 ? 3 : kDeepseek2LiteLayers, 64, mla, 128, 512, 256, 10000.0f, 1e-6f);
}
// Two MoE layers (8 experts: 2 routed + 1 shared) after the dense ones. Few, on purpose: a routed
// layer's top-k choice flips for a few tokens under any change of rounding (Q8_0, another engine's
// kernels), and each flip moves perplexity; measured against llama.cpp in Q8_0, 26 routed layers
// put the two engines 1.4% apart, 2 layers 0.03-0.2%.
SynthShape deepseek2_tiny_moe() { return with_experts(deepseek2_tiny(0), kDeepseek2LiteLayers - 2, 8, 2, 1, 32); }

const std::vector<NamedPreset>& presets() {
  static const std::vector<NamedPreset> kPresets = {
      // Real models' shapes (weights are random): the memory and speed of the real thing.
      {"llama-3.2-1b", llama3_scaled(make_shape("llama", 16, 2048, 32, 8, 64, 8192, 128256, 131072, 500000.0f, 1e-5f,
                                                 true, false),
                                      32.0f)},
      {"llama-2-7b", make_shape("llama", 32, 4096, 32, 32, 128, 11008, 32000, 4096, 10000.0f, 1e-5f, false, false)},
      // Tiny models for tests, one per attention kind.
      {"tiny-mha", make_shape("llama", 2, 64, 4, 4, 16, 128, 512, 256, 10000.0f, 1e-5f, true, false)},
      {"tiny-gqa", make_shape("llama", 2, 64, 8, 2, 8, 128, 512, 256, 10000.0f, 1e-5f, true, false)},
      {"tiny-mqa", make_shape("llama", 2, 64, 8, 1, 8, 128, 512, 256, 10000.0f, 1e-5f, true, false)},
      {"tiny-untied", make_shape("llama", 2, 64, 4, 2, 16, 128, 512, 256, 10000.0f, 1e-5f, false, false)},
      {"qwen2-tiny", make_shape("qwen2", 2, 64, 4, 2, 16, 128, 512, 256, 1000000.0f, 1e-6f, true, true)},
      {"qwen3-tiny", make_shape("qwen3", 2, 64, 4, 2, 32, 128, 512, 256, 1000000.0f, 1e-6f, true, false)},
      {"qwen3-0.6b", make_shape("qwen3", 28, 1024, 16, 8, 128, 3072, 151936, 40960, 1000000.0f, 1e-6f, true, false)},
      // Gemma 3: 6 layers so one is global (layer 5); a window of 24 crosses 16-token blocks.
      // Phi-3: q/k/v and gate/up fused; Phi-3-mini's shapes (4k context; its window of 2047).
      {"phi3-tiny", make_shape("phi3", 2, 64, 4, 4, 16, 128, 512, 256, 10000.0f, 1e-5f, false, false)},
      {"phi-3-mini", with_window(make_shape("phi3", 32, 3072, 32, 32, 96, 8192, 32064, 4096, 10000.0f, 1e-5f, false,
                                              false),
                                   2047)},
      {"gemma3-tiny", with_window(make_shape("gemma3", 6, 64, 4, 2, 32, 128, 512, 256, 1000000.0f, 1e-6f, true,
                                               false),
                                    24)},
      {"gemma-3-1b", with_window(make_shape("gemma3", 26, 1152, 4, 1, 256, 6912, 262144, 32768, 1000000.0f, 1e-6f,
                                              true, false),
                                   512)},
      {"deepseek-v2-lite", deepseek_v2_lite()},
      // DeepSeek-V2-Lite's attention, embeddings and dense first layer with a small MoE: 16 experts
      // of 256 instead of 64 of 1408, 6 routed + 2 shared per token as there; 1.6B parameters,
      // 1.70 GB in Q8_0, for benchmarks of MLA at the real model's widths (rows of 256: K-quants fit).
      {"deepseek-v2-lite-attn", with_experts(deepseek_v2_lite(), 1, 16, 6, 2, 256)},
      // Tiny deepseek2 models for tests, one per MLA and MoE feature (4 heads, untied; 27 layers
      // without q_lora, 3 with, as llama.cpp requires: see deepseek2_tiny).
      {"deepseek2-tiny", deepseek2_tiny(0)},                        // dense FFNs, plain attn_q, attn_kv_b
      {"deepseek2-tiny-qlora", deepseek2_tiny(96)},                 // + the q bottleneck (attn_q_a, attn_q_b)
      {"deepseek2-tiny-moe", deepseek2_tiny_moe()},                 // 25 dense layers, then 2 MoE layers
      {"deepseek2-tiny-moe-sigmoid", with_sigmoid_gating(deepseek2_tiny_moe(), 2.5f)},  // + exp_probs_b, norm, x2.5
      {"deepseek2-tiny-split", with_split_kv_b(deepseek2_tiny_moe())},                  // tiny-moe as attn_k_b/attn_v_b
      {"deepseek2-tiny-yarn", with_yarn(deepseek2_tiny(96), 4.0f, 64, 0.1f)},           // tiny-qlora, YaRN 4x over 64
  };
  return kPresets;
}

Status check_range(const char* field, int64_t value, int64_t min, int64_t max) {
  if (value < min || value > max) {
    return Status::errorf("synth shape: {} = {} is out of range [{}, {}]", field, value, min, max);
  }
  return Status::ok_status();
}

// The blocks of llama, qwen2, qwen3, gemma3 and phi3.
void add_llama_family_layers(SynthTensorGenerator& gen, const SynthShape& s) {
  const std::string& arch = s.architecture;
  const auto fan_in_std = [](int64_t fan_in) { return 1.0f / std::sqrt(static_cast<float>(fan_in)); };
  // Residual branches add 2 * num_layers terms; scaling each by 1/sqrt(2 * num_layers) keeps the stream's rms ~1.
  const auto residual_std = [&](int64_t fan_in) { return fan_in_std(fan_in * 2 * s.num_layers); };
  const Distribution norm = kNorm;
  const Distribution bias{0.0f, 0.1f};
  for (int l = 0; l < s.num_layers; ++l) {
    gen.vector(names::blk(l, names::kAttnNorm), s.dim, norm);
    if (arch == "phi3") {  // q, k and v stacked in one tensor, as phi3's converter writes them
      gen.matrix(names::blk(l, names::kAttnQkv), s.q_dim() + 2 * s.kv_dim(), s.dim, {0.0f, fan_in_std(s.dim)});
    } else {
      gen.matrix(names::blk(l, names::kAttnQ), s.q_dim(), s.dim, {0.0f, fan_in_std(s.dim)});
      gen.matrix(names::blk(l, names::kAttnK), s.kv_dim(), s.dim, {0.0f, fan_in_std(s.dim)});
      gen.matrix(names::blk(l, names::kAttnV), s.kv_dim(), s.dim, {0.0f, fan_in_std(s.dim)});
    }
    if (s.qkv_bias) {
      gen.vector(names::blk(l, names::kAttnQBias), s.q_dim(), bias);
      gen.vector(names::blk(l, names::kAttnKBias), s.kv_dim(), bias);
      gen.vector(names::blk(l, names::kAttnVBias), s.kv_dim(), bias);
    }
    if (arch == "qwen3" || arch == "gemma3") {
      gen.vector(names::blk(l, names::kAttnQNorm), s.head_dim, norm);
      gen.vector(names::blk(l, names::kAttnKNorm), s.head_dim, norm);
    }
    gen.matrix(names::blk(l, names::kAttnOutput), s.dim, s.q_dim(), {0.0f, residual_std(s.q_dim())});
    if (arch == "gemma3") gen.vector(names::blk(l, names::kAttnPostNorm), s.dim, norm);
    gen.vector(names::blk(l, names::kFfnNorm), s.dim, norm);
    if (arch == "phi3") {  // gate rows, then up rows, in one tensor
      gen.matrix(names::blk(l, names::kFfnUp), 2 * s.ffn_dim, s.dim, {0.0f, fan_in_std(s.dim)});
    } else {
      gen.matrix(names::blk(l, names::kFfnGate), s.ffn_dim, s.dim, {0.0f, fan_in_std(s.dim)});
      gen.matrix(names::blk(l, names::kFfnUp), s.ffn_dim, s.dim, {0.0f, fan_in_std(s.dim)});
    }
    gen.matrix(names::blk(l, names::kFfnDown), s.dim, s.ffn_dim, {0.0f, residual_std(s.ffn_dim)});
    if (arch == "gemma3") gen.vector(names::blk(l, names::kFfnPostNorm), s.dim, norm);
  }
}

}  // namespace

int64_t SynthShape::num_parameters() const {
  if (architecture == "deepseek2") return synth_internal::deepseek2_num_parameters(*this);
  const int64_t d = dim;
  const int64_t per_layer = 2 * d                                          // attn_norm, ffn_norm
                            + d * q_dim() + 2 * d * kv_dim() + q_dim() * d  // q, k, v, output
                            + 3 * d * ffn_dim                              // gate, up, down
                            + (qkv_bias ? q_dim() + 2 * kv_dim() : 0)
                            + (architecture == "qwen3" || architecture == "gemma3" ? 2 * head_dim : 0)
                            + (architecture == "gemma3" ? 2 * d : 0);  // post-norms
  const bool freqs_tensor = rope_scaling.type == "llama3";
  return int64_t{vocab_size} * d * (tied_output ? 1 : 2) + d + per_layer * num_layers + (freqs_tensor ? head_dim / 2 : 0);
}

Status SynthShape::validate() const {
  if (architecture != "llama" && architecture != "qwen2" && architecture != "qwen3" && architecture != "gemma3" &&
      architecture != "phi3" && architecture != "deepseek2") {
    return Status::errorf(
        "synth shape: architecture '{}' is not supported (llama, qwen2, qwen3, gemma3, phi3, deepseek2)", architecture);
  }
  if (architecture == "gemma3" && sliding_window <= 0) {
    return Status::errorf("synth shape: gemma3 needs a sliding window (got {})", sliding_window);
  }
  if (architecture != "gemma3" && architecture != "phi3" && (sliding_window != 0 || sliding_window_period != 0)) {
    return Status::errorf("synth shape: a sliding window is a gemma3 or phi3 feature, not {}'s", architecture);
  }
  if (architecture == "phi3" && sliding_window_period != 0) {
    return Status::errorf("synth shape: phi3's window covers every layer; no period");
  }
  if (sliding_window_period < 0 || sliding_window_period > num_layers + 1) {
    return Status::errorf("synth shape: sliding_window_period = {} is out of range [0, {}]", sliding_window_period,
                          num_layers + 1);
  }
  if (!(rope_freq_base_swa > 0.0f) || !std::isfinite(rope_freq_base_swa)) {
    return Status::errorf("synth shape: rope_freq_base_swa = {} must be positive and finite", rope_freq_base_swa);
  }
  const SynthRopeScaling& r = rope_scaling;
  if (r.type != "none" && r.type != "linear" && r.type != "yarn" && r.type != "llama3" && r.type != "llama3-metadata") {
    return Status::errorf("synth shape: rope scaling '{}' is not one of none, linear, yarn, llama3, llama3-metadata",
                          r.type);
  }
  if (r.type != "none" && (!(r.factor >= 1.0f) || !std::isfinite(r.factor))) {
    return Status::errorf("synth shape: rope scaling factor {} must be >= 1", r.factor);
  }
  if ((r.type == "yarn" || r.type.starts_with("llama3")) && r.original_context <= 0) {
    return Status::errorf("synth shape: rope scaling '{}' needs an original context length", r.type);
  }
  if (r.type.starts_with("llama3") && !(r.high_freq_factor > r.low_freq_factor && r.low_freq_factor > 0.0f)) {
    return Status::errorf("synth shape: llama3 rope needs high_freq_factor {} > low_freq_factor {} > 0",
                          r.high_freq_factor, r.low_freq_factor);
  }
  // Bounds match what the model loader accepts and keep byte counts far from overflow.
  KVLM_RETURN_IF_ERROR(check_range("num_layers", num_layers, 1, 1024));
  KVLM_RETURN_IF_ERROR(check_range("dim", dim, 1, 1 << 16));
  KVLM_RETURN_IF_ERROR(check_range("num_heads", num_heads, 1, 1024));
  KVLM_RETURN_IF_ERROR(check_range("ffn_dim", ffn_dim, 1, 1 << 20));
  KVLM_RETURN_IF_ERROR(check_range("vocab_size", vocab_size, kSynthMinVocabSize, 1 << 22));
  KVLM_RETURN_IF_ERROR(check_range("context_length", context_length, 1, 1 << 24));
  if (!(rope_freq_base > 0.0f) || !std::isfinite(rope_freq_base)) {
    return Status::errorf("synth shape: rope_freq_base = {} must be positive and finite", rope_freq_base);
  }
  if (!(rms_eps > 0.0f) || !std::isfinite(rms_eps)) {
    return Status::errorf("synth shape: rms_eps = {} must be positive and finite", rms_eps);
  }
  // deepseek2's head lengths follow from its MLA dims (checked there); it rotates qk_rope_dim, not head_dim.
  if (architecture == "deepseek2") return synth_internal::validate_deepseek2_shape(*this);
  KVLM_RETURN_IF_ERROR(check_range("num_kv_heads", num_kv_heads, 1, num_heads));
  KVLM_RETURN_IF_ERROR(check_range("head_dim", head_dim, 2, 1024));
  if (num_heads % num_kv_heads != 0) {
    return Status::errorf("synth shape: num_heads = {} is not a multiple of num_kv_heads = {}", num_heads,
                          num_kv_heads);
  }
  if (head_dim % 2 != 0) return Status::errorf("synth shape: head_dim = {} must be even for RoPE", head_dim);
  return synth_internal::check_no_deepseek2_fields(*this);
}

std::optional<std::string> synth_llama_cpp_incompatibility(const SynthShape& s) {
  if (s.architecture != "deepseek2") return std::nullopt;
  // Measured with the anchor build (shared/anchors/llama.cpp): it decides whether a deepseek2 file has a
  // q bottleneck by the layer count alone, taking 26 and 27 for DeepSeek-V2-Lite and GigaChat3.
  const bool lite_layers = s.num_layers == 26 || s.num_layers == kDeepseek2LiteLayers;
  if (s.q_lora_rank == 0 && !lite_layers) {
    return fmt::format("llama.cpp reads a deepseek2 file without a q bottleneck (q_lora_rank 0) only at 26 or 27 "
                       "layers, the layer counts of the models that have none; at {} it fails with \"key not found "
                       "in model: deepseek2.attention.q_lora_rank\"",
                       s.num_layers);
  }
  if (s.q_lora_rank > 0 && lite_layers) {
    return fmt::format("llama.cpp takes a deepseek2 file of {} layers for DeepSeek-V2-Lite, which has no q "
                       "bottleneck: with q_lora_rank {} it fails with \"tensor 'blk.0.attn_q.weight' not found\"",
                       s.num_layers, s.q_lora_rank);
  }
  if (s.num_experts > 0 && s.num_shared_experts == 0) {
    return fmt::format("llama.cpp needs shared experts in a deepseek2 MoE layer: without, it fails with \"tensor "
                       "'blk.{}.ffn_gate_shexp.weight' not found\"",
                       s.leading_dense_layers);
  }
  return std::nullopt;
}

std::vector<std::string> synth_preset_names() {
  std::vector<std::string> out;
  for (const NamedPreset& p : presets()) out.emplace_back(p.name);
  return out;
}

Result<SynthShape> synth_preset(std::string_view name) {
  for (const NamedPreset& p : presets()) {
    if (name == p.name) return p.shape;
  }
  return Status::errorf("unknown synth preset '{}' (presets: {})", name, fmt::join(synth_preset_names(), ", "));
}

Status synthesize_model(const SynthOptions& options) {
  const SynthShape& s = options.shape;
  KVLM_RETURN_IF_ERROR(s.validate());
  const GgmlType wt = options.weight_type;
  if (!ggml_type_traits(wt).supported) {
    return Status::errorf("synth: weight type {} is not supported", ggml_type_name(wt));
  }
  if (options.out_path.empty()) return Status::error("synth: no output path given");
  if (options.num_threads < 0) return Status::errorf("synth: num_threads = {} must be >= 0", options.num_threads);
  KVLM_ASSIGN_OR_RETURN(SpmVocab vocab, make_synthetic_vocab(s.vocab_size));
  if (s.architecture == "phi3") {
    // Phi-3's chat tokens, which llama.cpp's loader looks up for this architecture: in place of
    // the last pieces, as control tokens.
    const char* kPhi3Tokens[] = {"<|endoftext|>", "<|assistant|>", "<|system|>", "<|end|>", "<|user|>"};
    size_t at = vocab.tokens.size() - std::size(kPhi3Tokens);
    for (const char* token : kPhi3Tokens) {
      vocab.tokens[at] = token;
      vocab.scores[at] = 0.0f;
      vocab.token_types[at] = static_cast<int32_t>(TokenType::kControl);
      ++at;
    }
  }

  const std::string& arch = s.architecture;
  GgufWriter w;
  w.set_string(names::kArchitecture, arch);
  w.set_string(names::kName, options.name.empty() ? std::string("synthetic") : options.name);
  w.set_u32(names::kFileType, gguf_file_type(wt));
  w.set_u32(names::key(arch, names::kContextLength), static_cast<uint32_t>(s.context_length));
  w.set_u32(names::key(arch, names::kEmbeddingLength), static_cast<uint32_t>(s.dim));
  w.set_u32(names::key(arch, names::kBlockCount), static_cast<uint32_t>(s.num_layers));
  w.set_u32(names::key(arch, names::kFeedForwardLength), static_cast<uint32_t>(s.ffn_dim));
  w.set_u32(names::key(arch, names::kHeadCount), static_cast<uint32_t>(s.num_heads));
  if (arch == "deepseek2") {
    synth_internal::add_deepseek2_metadata(w, s);
  } else {
    w.set_u32(names::key(arch, names::kHeadCountKv), static_cast<uint32_t>(s.num_kv_heads));
    // Explicit even when head_dim == dim / num_heads, so readers never have to infer it.
    w.set_u32(names::key(arch, names::kKeyLength), static_cast<uint32_t>(s.head_dim));
    w.set_u32(names::key(arch, names::kValueLength), static_cast<uint32_t>(s.head_dim));
    w.set_u32(names::key(arch, names::kRopeDimensionCount), static_cast<uint32_t>(s.head_dim));
  }
  w.set_f32(names::key(arch, names::kRopeFreqBase), s.rope_freq_base);
  w.set_f32(names::key(arch, names::kRmsEps), s.rms_eps);
  w.set_u32(names::key(arch, names::kVocabSize), static_cast<uint32_t>(s.vocab_size));
  const SynthRopeScaling& rs = s.rope_scaling;
  if (rs.type == "linear" || rs.type == "yarn" || rs.type == "llama3-metadata") {
    w.set_string(names::key(arch, names::kRopeScalingType), rs.type == "llama3-metadata" ? "llama3" : rs.type);
    w.set_f32(names::key(arch, names::kRopeScalingFactor), rs.factor);
  }
  if (rs.type == "yarn" || rs.type == "llama3-metadata") {
    w.set_u32(names::key(arch, names::kRopeScalingOrigContext), static_cast<uint32_t>(rs.original_context));
  }
  if (rs.type == "llama3-metadata") {
    w.set_f32(names::key(arch, names::kRopeLowFreqFactor), rs.low_freq_factor);
    w.set_f32(names::key(arch, names::kRopeHighFreqFactor), rs.high_freq_factor);
  }
  if (arch == "phi3" && s.sliding_window > 0) {
    w.set_u32(names::key(arch, names::kSlidingWindow), static_cast<uint32_t>(s.sliding_window));
  }
  if (arch == "gemma3") {
    w.set_u32(names::key(arch, names::kSlidingWindow), static_cast<uint32_t>(s.sliding_window));
    if (s.sliding_window_period > 0) {
      w.set_u32(names::key(arch, names::kSlidingWindowPattern), static_cast<uint32_t>(s.sliding_window_period));
    }
    w.set_f32(names::key(arch, names::kRopeFreqBaseSwa), s.rope_freq_base_swa);
  }
  add_spm_vocab_metadata(w, vocab);

  ThreadPool pool(options.num_threads > 0 ? options.num_threads : ThreadPool::default_num_threads());
  SynthTensorGenerator gen(w, pool, options.seed, wt);
  const Distribution embedding{0.0f, 2.0f / std::sqrt(static_cast<float>(s.dim))};
  if (rs.type == "llama3") {
    gen.values(names::kRopeFreqs, llama3_frequency_factors(s.head_dim, s.rope_freq_base, rs.factor, rs.low_freq_factor,
                                                           rs.high_freq_factor, rs.original_context));
  }
  gen.matrix(names::kTokenEmbd, s.vocab_size, s.dim, embedding);
  gen.vector(names::kOutputNorm, s.dim, kNorm);
  if (!s.tied_output) gen.matrix(names::kOutput, s.vocab_size, s.dim, embedding);
  if (arch == "deepseek2") {
    synth_internal::add_deepseek2_layers(gen, s);
  } else {
    add_llama_family_layers(gen, s);
  }
  return w.write(options.out_path);
}

}  // namespace kvlm
