// `kvlm demo`: the embedded default job. Synthesizes a small model (no download), generates with
// the paged cache, and shows the cache's bytes per token and the cached-vs-recomputed check.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "cli_error.h"
#include "commands.h"
#include "engine/generator.h"
#include "model/llama_model.h"
#include "model/model_synthesizer.h"
#include "run_report.h"

namespace kvlm::cli {
namespace {

struct DemoFlags {
  std::string dir;
  std::string preset = "tiny-gqa";
  int max_tokens = 64;
  int threads = 0;
};

// Random weights emit arbitrary byte tokens: show them as \xNN instead of broken UTF-8.
std::string printable(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (c == '\n' || (c >= 0x20 && c < 0x7f)) {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  return out;
}

// The tolerance the test suite holds the F32 cache to; F16 rounding is reported, not judged here.
constexpr double kF32Tolerance = 1e-4;

void run(const DemoFlags& f) {
  const std::filesystem::path dir =
      f.dir.empty() ? std::filesystem::temp_directory_path() / "kvlm-demo" : std::filesystem::path(f.dir);
  std::filesystem::create_directories(dir);
  const std::string path = (dir / (f.preset + ".gguf")).string();

  SynthOptions synth;
  synth.shape = value_or_throw(synth_preset(f.preset));
  synth.seed = 7;
  synth.name = f.preset;
  synth.out_path = path;
  throw_if_error(synthesize_model(synth));
  const SynthShape& s = synth.shape;
  std::printf("== kvlm demo ==\nsynthesized %s: %d layers, dim %d, %d query heads / %d kv heads, head_dim %d, vocab %d\n",
              path.c_str(), s.num_layers, s.dim, s.num_heads, s.num_kv_heads, s.head_dim, s.vocab_size);

  auto model = value_or_throw(LlamaModel::load(path));
  ThreadPool pool(resolve_threads(f.threads));
  Generator generator(*model, pool);
  const std::vector<TokenId> prompt = model->tokenizer().encode("Once upon a time", true);

  bool all_ok = true;
  for (const char* kv : {"f32", "f16"}) {
    GenerationOptions options;
    options.max_tokens = f.max_tokens;
    // Sampled with a fixed seed: greedy decoding of random weights tends to repeat one token.
    options.sampler.temperature = 1.0f;
    options.sampler.seed = 1;
    options.k_type = options.v_type = *parse_kv_type(kv);
    options.verify = true;
    options.stop_at_eos = false;
    auto result = value_or_throw(generator.generate(prompt, options, {}));
    std::printf("\n-- %s cache --\ntext (random weights, so not English): %s\n", kv, printable(result.text).c_str());
    const RunDescription desc{path, options.k_type, options.v_type, 0, options.storage.kivi_residual_tokens,
                              options.eviction};
    std::printf("%s", format_stats(result, *model, desc).c_str());
    if (std::string(kv) == "f32") {
      const bool ok = result.stats.verify_max_rel_error <= kF32Tolerance && result.stats.blocks_leaked == 0;
      std::printf("check            cached decode == recomputation within %.0e: %s\n", kF32Tolerance,
                  ok ? "PASS" : "FAIL");
      all_ok &= ok;
    }
  }
  if (!all_ok) throw CliError("the cached forward disagrees with the reference");
}

}  // namespace

CLI::App* add_demo_command(CLI::App& app) {
  auto flags = std::make_shared<DemoFlags>();
  CLI::App* cmd = app.add_subcommand("demo", "Synthesize a small model and show generation, KV bytes and the check");
  cmd->add_option("--dir", flags->dir, "where to write the synthesized model (default: a temp folder)");
  cmd->add_option("--preset", flags->preset, "model shape preset")->capture_default_str();
  cmd->add_option("--max-tokens,-n", flags->max_tokens, "tokens to generate")->capture_default_str();
  cmd->add_option("--threads,-t", flags->threads, "threads (default: all cores)");
  cmd->callback([flags] { run(*flags); });
  return cmd;
}

}  // namespace kvlm::cli
