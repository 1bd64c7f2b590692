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
  uint64_t seed = 1;
  std::string name;
};

void run(const SynthFlags& f, const CLI::App& cmd) {
  SynthShape shape;
  if (!f.preset.empty()) {
    shape = value_or_throw(synth_preset(f.preset));
  } else {
    shape = value_or_throw(synth_preset("tiny-gqa"));  // explicit flags override its fields below
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
  if (cmd.count("--heads") && !cmd.count("--head-dim") && shape.dim % shape.num_heads == 0) {
    shape.head_dim = shape.dim / shape.num_heads;
  }
  if (cmd.count("--arch")) shape.architecture = f.arch;
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
  std::printf("wrote %s: %s, %d layers, dim %d, %d heads / %d kv heads, head_dim %d, ffn %d, vocab %d, %s weights\n",
              f.out.c_str(), shape.architecture.c_str(), shape.num_layers, shape.dim, shape.num_heads,
              shape.num_kv_heads, shape.head_dim, shape.ffn_dim, shape.vocab_size, f.type.c_str());
}

}  // namespace

CLI::App* add_synth_command(CLI::App& app) {
  auto flags = std::make_shared<SynthFlags>();
  CLI::App* cmd = app.add_subcommand("synth", "Write a deterministic random-weight GGUF model");
  cmd->add_option("--out,-o", flags->out, "output GGUF path")->required();
  cmd->add_option("--preset", flags->preset, fmt::format("named shape: {}", fmt::join(synth_preset_names(), ", ")));
  cmd->add_option("--arch", flags->arch, "architecture: llama | qwen2 | qwen3 | gemma3 | phi3")->capture_default_str();
  cmd->add_option("--type", flags->type, fmt::format("weight type: {}", supported_ggml_type_names()))->capture_default_str();
  cmd->add_option("--layers", flags->layers, "transformer blocks");
  cmd->add_option("--dim", flags->dim, "residual width");
  cmd->add_option("--heads", flags->heads, "query heads");
  cmd->add_option("--kv-heads", flags->kv_heads, "key/value heads (MHA = heads, MQA = 1)");
  cmd->add_option("--head-dim", flags->head_dim, "dimensions per head");
  cmd->add_option("--ffn", flags->ffn, "feed-forward width");
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
  cmd->add_option("--tied", flags->tied, "1: output shares the embedding, 0: separate output matrix");
  cmd->add_option("--seed", flags->seed, "weights seed")->capture_default_str();
  cmd->add_option("--name", flags->name, "general.name");
  cmd->callback([flags, cmd] { run(*flags, *cmd); });
  return cmd;
}

}  // namespace kvlm::cli
