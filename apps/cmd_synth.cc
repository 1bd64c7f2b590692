// `kvlm synth`: write a deterministic random-weight GGUF model of a given shape or preset.
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/ranges.h>

#include "cli_error.h"
#include "commands.h"
#include "model/model_synthesizer.h"

namespace kvlm::cli {
namespace {

struct SynthFlags {
  std::string out;
  std::string preset;
  std::string arch = "llama";
  std::string type = "f32";
  int layers = 0, dim = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0, vocab = 0, context = 0;
  float rope_base = 0;
  std::string rope_scaling;
  float rope_factor = 0;
  int rope_orig_ctx = 0;
  int sliding_window = 0, swa_period = 0;
  float rope_base_swa = 0;
  int tied = -1;  // -1: preset's choice
  // deepseek2
  int q_lora_rank = 0, kv_lora_rank = 0, qk_nope_dim = 0, qk_rope_dim = 0, v_head_dim = 0;
  std::string mla_layout;
  int leading_dense_layers = 0, experts = 0, experts_used = 0, shared_experts = 0, expert_ffn = 0;
  std::string expert_gating;
  int expert_weights_norm = 0, expert_bias = 0;
  float expert_weights_scale = 0, yarn_log_multiplier = 0;
  uint64_t seed = 1;
  std::string name;
};

// The deepseek2 fields: a preset of another architecture has none (as a window belongs to its
// architecture), so a flag given for one is refused by validate(), naming the field.
void apply_deepseek2_flags(const SynthFlags& f, const CLI::App& cmd, SynthShape& shape) {
  if (shape.architecture != "deepseek2") {
    const SynthShape defaults;
    shape.q_lora_rank = defaults.q_lora_rank;
    shape.kv_lora_rank = defaults.kv_lora_rank;
    shape.qk_nope_dim = defaults.qk_nope_dim;
    shape.qk_rope_dim = defaults.qk_rope_dim;
    shape.v_head_dim = defaults.v_head_dim;
    shape.mla_layout = defaults.mla_layout;
    shape.leading_dense_layers = defaults.leading_dense_layers;
    shape.num_experts = defaults.num_experts;
    shape.num_experts_used = defaults.num_experts_used;
    shape.num_shared_experts = defaults.num_shared_experts;
    shape.expert_ffn_dim = defaults.expert_ffn_dim;
    shape.expert_gating = defaults.expert_gating;
    shape.expert_weights_norm = defaults.expert_weights_norm;
    shape.expert_weights_scale = defaults.expert_weights_scale;
    shape.expert_bias = defaults.expert_bias;
    shape.rope_scaling.yarn_log_multiplier = defaults.rope_scaling.yarn_log_multiplier;
  }
  auto override_count = [&](const char* flag, int value, int& field) {
    if (cmd.count(flag) == 0) return;
    if (value < 0) throw CliError(fmt::format("{} must be >= 0, got {}", flag, value));
    field = value;
  };
  override_count("--q-lora-rank", f.q_lora_rank, shape.q_lora_rank);
  override_count("--kv-lora-rank", f.kv_lora_rank, shape.kv_lora_rank);
  override_count("--qk-nope-dim", f.qk_nope_dim, shape.qk_nope_dim);
  override_count("--qk-rope-dim", f.qk_rope_dim, shape.qk_rope_dim);
  override_count("--v-head-dim", f.v_head_dim, shape.v_head_dim);
  override_count("--leading-dense-layers", f.leading_dense_layers, shape.leading_dense_layers);
  override_count("--experts", f.experts, shape.num_experts);
  override_count("--experts-used", f.experts_used, shape.num_experts_used);
  override_count("--shared-experts", f.shared_experts, shape.num_shared_experts);
  override_count("--expert-ffn", f.expert_ffn, shape.expert_ffn_dim);
  if (cmd.count("--mla-layout")) {
    if (f.mla_layout == "kv_b") {
      shape.mla_layout = SynthMlaLayout::kKvB;
    } else if (f.mla_layout == "split") {
      shape.mla_layout = SynthMlaLayout::kSplit;
    } else {
      throw CliError(fmt::format("--mla-layout '{}' is not one of: kv_b, split", f.mla_layout));
    }
  }
  if (cmd.count("--expert-gating")) {
    if (f.expert_gating == "softmax") {
      shape.expert_gating = SynthExpertGating::kSoftmax;
    } else if (f.expert_gating == "sigmoid") {
      shape.expert_gating = SynthExpertGating::kSigmoid;
    } else {
      throw CliError(fmt::format("--expert-gating '{}' is not one of: softmax, sigmoid", f.expert_gating));
    }
  }
  if (cmd.count("--expert-weights-norm")) shape.expert_weights_norm = f.expert_weights_norm != 0;
  if (cmd.count("--expert-weights-scale")) shape.expert_weights_scale = f.expert_weights_scale;
  if (cmd.count("--expert-bias")) shape.expert_bias = f.expert_bias != 0;
  if (cmd.count("--yarn-log-multiplier")) {
    shape.rope_scaling.yarn_log_multiplier = f.yarn_log_multiplier;
  } else if (shape.rope_scaling.type != "yarn") {
    shape.rope_scaling.yarn_log_multiplier = 0.0f;  // a preset's multiplier belongs to its YaRN
  }
  if (shape.architecture != "deepseek2") return;

  // A dense model has no expert fields; its every layer is a leading dense one.
  if (shape.num_experts == 0) {
    if (!cmd.count("--experts-used")) shape.num_experts_used = 0;
    if (!cmd.count("--shared-experts")) shape.num_shared_experts = 0;
    if (!cmd.count("--expert-ffn")) shape.expert_ffn_dim = 0;
    if (!cmd.count("--leading-dense-layers")) shape.leading_dense_layers = shape.num_layers;
    if (!cmd.count("--expert-bias")) shape.expert_bias = false;
  }
  if (shape.expert_gating == SynthExpertGating::kSoftmax && !cmd.count("--expert-bias")) shape.expert_bias = false;
  // MLA's per-head fields follow from its own: every head reads the one latent.
  if (cmd.count("--kv-heads") || cmd.count("--head-dim")) {
    throw CliError("deepseek2 takes no --kv-heads or --head-dim: its heads' lengths are --qk-nope-dim, "
                   "--qk-rope-dim and --v-head-dim");
  }
  shape.num_kv_heads = shape.num_heads;
  shape.head_dim = shape.qk_nope_dim + shape.qk_rope_dim;
}

std::string describe(const SynthShape& s) {
  if (s.architecture != "deepseek2") {
    return fmt::format("{}, {} layers, dim {}, {} heads / {} kv heads, head_dim {}, ffn {}, vocab {}", s.architecture,
                       s.num_layers, s.dim, s.num_heads, s.num_kv_heads, s.head_dim, s.ffn_dim, s.vocab_size);
  }
  std::string moe = "no experts";
  if (s.num_experts > 0) {
    moe = fmt::format("{} dense layers, then {} experts of {} ({} routed + {} shared, {} gating)",
                      s.leading_dense_layers, s.num_experts, s.expert_ffn_dim, s.num_experts_used,
                      s.num_shared_experts, s.expert_gating == SynthExpertGating::kSigmoid ? "sigmoid" : "softmax");
  }
  return fmt::format("deepseek2, {} layers, dim {}, {} heads, MLA kv_lora {} q_lora {} (nope {} + rope {}, v {}, {} "
                     "layout), ffn {}, {}, vocab {}",
                     s.num_layers, s.dim, s.num_heads, s.kv_lora_rank, s.q_lora_rank, s.qk_nope_dim, s.qk_rope_dim,
                     s.v_head_dim, s.mla_layout == SynthMlaLayout::kSplit ? "split k_b/v_b" : "kv_b", s.ffn_dim, moe,
                     s.vocab_size);
}

void run(const SynthFlags& f, const CLI::App& cmd) {
  SynthShape shape;
  if (!f.preset.empty()) {
    shape = value_or_throw(synth_preset(f.preset));
  } else {
    // Explicit flags override the fields of the architecture's smallest preset below.
    shape = value_or_throw(synth_preset(f.arch == "deepseek2" ? "deepseek2-tiny" : "tiny-gqa"));
    shape.architecture = f.arch;
  }
  auto override_int = [&](const char* flag, int value, int& field) {
    if (cmd.count(flag) == 0) return;
    if (value <= 0) throw CliError(fmt::format("{} must be positive, got {}", flag, value));
    field = value;
  };
  override_int("--layers", f.layers, shape.num_layers);
  override_int("--dim", f.dim, shape.dim);
  override_int("--heads", f.heads, shape.num_heads);
  override_int("--kv-heads", f.kv_heads, shape.num_kv_heads);
  override_int("--head-dim", f.head_dim, shape.head_dim);
  override_int("--ffn", f.ffn, shape.ffn_dim);
  override_int("--vocab", f.vocab, shape.vocab_size);
  override_int("--context", f.context, shape.context_length);
  if (cmd.count("--arch")) shape.architecture = f.arch;
  if (shape.architecture != "deepseek2" && cmd.count("--heads") && !cmd.count("--head-dim") &&
      shape.dim % shape.num_heads == 0) {
    shape.head_dim = shape.dim / shape.num_heads;
  }
  if (cmd.count("--rope-base")) shape.rope_freq_base = f.rope_base;
  if (f.tied >= 0) shape.tied_output = f.tied != 0;
  if (cmd.count("--rope-scaling")) shape.rope_scaling.type = f.rope_scaling;
  if (cmd.count("--rope-factor")) shape.rope_scaling.factor = f.rope_factor;
  if (cmd.count("--rope-orig-ctx")) shape.rope_scaling.original_context = f.rope_orig_ctx;
  if (cmd.count("--sliding-window")) shape.sliding_window = f.sliding_window;
  if (cmd.count("--swa-period")) shape.sliding_window_period = f.swa_period;
  if (cmd.count("--rope-base-swa")) shape.rope_freq_base_swa = f.rope_base_swa;
  if (shape.architecture == "gemma3" && shape.sliding_window == 0) shape.sliding_window = 24;  // gemma3-tiny's
  if (shape.architecture != "gemma3" && shape.architecture != "phi3" && !cmd.count("--sliding-window")) {
    shape.sliding_window = 0;  // a preset's window belongs to its architecture
  }
  apply_deepseek2_flags(f, cmd, shape);

  SynthOptions options;
  options.shape = shape;
  auto type = parse_ggml_type(f.type);
  if (!type || !ggml_type_traits(*type).supported) {
    throw CliError(fmt::format("--type '{}' is not one of: {}", f.type, supported_ggml_type_names()));
  }
  options.weight_type = *type;
  options.seed = f.seed;
  options.name = f.name.empty() ? (f.preset.empty() ? std::string("kvlm-synth") : f.preset) : f.name;
  options.out_path = f.out;
  throw_if_error(synthesize_model(options));
  if (auto why = synth_llama_cpp_incompatibility(shape)) std::fprintf(stderr, "warning: %s\n", why->c_str());
  std::printf("wrote %s: %s, %s weights\n", f.out.c_str(), describe(shape).c_str(), f.type.c_str());
}

}  // namespace

CLI::App* add_synth_command(CLI::App& app) {
  auto flags = std::make_shared<SynthFlags>();
  CLI::App* cmd = app.add_subcommand("synth", "Write a deterministic random-weight GGUF model");
  cmd->add_option("--out,-o", flags->out, "output GGUF path")->required();
  cmd->add_option("--preset", flags->preset, fmt::format("named shape: {}", fmt::join(synth_preset_names(), ", ")));
  cmd->add_option("--arch", flags->arch, "architecture: llama | qwen2 | qwen3 | gemma3 | phi3 | deepseek2")
      ->capture_default_str();
  cmd->add_option("--type", flags->type, fmt::format("weight type: {}", supported_ggml_type_names()))->capture_default_str();
  cmd->add_option("--layers", flags->layers, "transformer blocks");
  cmd->add_option("--dim", flags->dim, "residual width");
  cmd->add_option("--heads", flags->heads, "query heads");
  cmd->add_option("--kv-heads", flags->kv_heads, "key/value heads (MHA = heads, MQA = 1; not deepseek2)");
  cmd->add_option("--head-dim", flags->head_dim, "dimensions per head (not deepseek2)");
  cmd->add_option("--ffn", flags->ffn, "feed-forward width (deepseek2: the dense layers')");
  cmd->add_option("--vocab", flags->vocab, "vocabulary size");
  cmd->add_option("--context", flags->context, "context length written to the file");
  cmd->add_option("--rope-base", flags->rope_base, "RoPE frequency base");
  cmd->add_option("--rope-scaling", flags->rope_scaling,
                  "none | linear | yarn | llama3 (rope_freqs tensor) | llama3-metadata (rope_scaling keys)");
  cmd->add_option("--rope-factor", flags->rope_factor, "RoPE scaling factor (context extension)");
  cmd->add_option("--rope-orig-ctx", flags->rope_orig_ctx, "original context length (yarn, llama3)");
  cmd->add_option("--sliding-window", flags->sliding_window, "gemma3: tokens a local layer sees; phi3: every layer's window (0 = the key left out)");
  cmd->add_option("--swa-period", flags->swa_period,
                  "gemma3: every N-th layer is global, written as attention.sliding_window_pattern (default: "
                  "left out, Gemma 3's 6)");
  cmd->add_option("--rope-base-swa", flags->rope_base_swa, "gemma3: RoPE base of the local layers (10000)");
  cmd->add_option("--q-lora-rank", flags->q_lora_rank, "deepseek2: query bottleneck rank (0: one attn_q matrix)");
  cmd->add_option("--kv-lora-rank", flags->kv_lora_rank, "deepseek2: MLA latent width (attn_kv_a_mqa rows, less rope)");
  cmd->add_option("--qk-nope-dim", flags->qk_nope_dim, "deepseek2: per-head query/key dims without RoPE");
  cmd->add_option("--qk-rope-dim", flags->qk_rope_dim, "deepseek2: per-head query/key dims with RoPE (even)");
  cmd->add_option("--v-head-dim", flags->v_head_dim, "deepseek2: per-head value dims");
  cmd->add_option("--mla-layout", flags->mla_layout,
                  "deepseek2: kv_b (attn_kv_b, older converters) | split (attn_k_b + attn_v_b, newer converters)");
  cmd->add_option("--leading-dense-layers", flags->leading_dense_layers,
                  "deepseek2: the first N layers have a dense FFN (default with --experts 0: all)");
  cmd->add_option("--experts", flags->experts, "deepseek2: routed experts per MoE layer (0: every layer dense)");
  cmd->add_option("--experts-used", flags->experts_used, "deepseek2: routed experts per token");
  cmd->add_option("--shared-experts", flags->shared_experts, "deepseek2: always-on shared experts");
  cmd->add_option("--expert-ffn", flags->expert_ffn, "deepseek2: one expert's FFN width");
  cmd->add_option("--expert-gating", flags->expert_gating, "deepseek2: softmax | sigmoid");
  cmd->add_option("--expert-weights-norm", flags->expert_weights_norm,
                  "deepseek2: 1 renormalizes the chosen experts' weights to sum 1");
  cmd->add_option("--expert-weights-scale", flags->expert_weights_scale,
                  "deepseek2: routed experts' output scale");
  cmd->add_option("--expert-bias", flags->expert_bias, "deepseek2: 1 writes exp_probs_b (sigmoid gating only)");
  cmd->add_option("--yarn-log-multiplier", flags->yarn_log_multiplier,
                  "deepseek2 yarn: rope.scaling.yarn_log_multiplier (0 = the key left out)");
  cmd->add_option("--tied", flags->tied, "1: output shares the embedding, 0: separate output matrix");
  cmd->add_option("--seed", flags->seed, "weights seed")->capture_default_str();
  cmd->add_option("--name", flags->name, "general.name");
  cmd->callback([flags, cmd] { run(*flags, *cmd); });
  return cmd;
}

}  // namespace kvlm::cli
