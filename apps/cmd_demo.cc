// `kvlm demo`: the default job. Tells a short story with the model compiled into the binary
// (stories260K), under an F32 cache and a quantized one, and shows what each cache costs per token,
// what the live pool held against the planner's formula, and the cached-vs-recomputed check.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli_error.h"
#include "commands.h"
#include "demo_server.h"
#include "engine/generator.h"
#include "kv/kv_type.h"
#include "model/llama_model.h"
#include "model_source.h"
#include "planner_check.h"

namespace kvlm::cli {
namespace {

struct DemoFlags {
  std::string model;  // empty: the embedded stories260K
  std::string prompt = "Once upon a time";
  std::string kv_type = "int8";
  int max_tokens = 64;
  int threads = 0;
};

// The tolerance the test suite holds the F32 cache to; a quantized cache's error is reported, not judged.
constexpr double kF32Tolerance = 1e-4;
constexpr int kBlockSize = 16;

struct CacheRun {
  KvType type = KvType::kF32;
  GenerationResult result;
  PlannerCheck planner;
};

CacheRun generate_with(Generator& generator, const LlamaModel& model, const std::vector<TokenId>& prompt,
                       KvType type, int max_tokens) {
  GenerationOptions options;
  options.max_tokens = max_tokens;
  options.sampler.temperature = 0.0f;  // greedy: the same story on every machine
  options.k_type = options.v_type = type;
  options.block_size = kBlockSize;
  options.verify = true;
  CacheRun run{type, value_or_throw(generator.generate(prompt, options, {})), {}};
  const GenerationStats& s = run.result.stats;
  run.planner = check_against_planner(model.config(), type, type, s.block_size, {s.kv_tokens_cached},
                                      s.kv_bytes_allocated, options.storage.kivi_residual_tokens,
                                      s.kv_staging_bytes_peak);
  return run;
}

// 1185376 -> "1,185,376".
std::string grouped(uint64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// The first generated token where two runs part, or -1 when they agree.
int first_difference(const GenerationResult& a, const GenerationResult& b, int num_prompt) {
  const size_t n = std::min(a.tokens.size(), b.tokens.size());
  for (size_t i = num_prompt; i < n; ++i) {
    if (a.tokens[i] != b.tokens[i]) return static_cast<int>(i) - num_prompt;
  }
  return a.tokens.size() == b.tokens.size() ? -1 : static_cast<int>(n) - num_prompt;
}

void run(const DemoFlags& f) {
  const std::optional<KvType> quantized = parse_kv_type(f.kv_type);
  if (!quantized) throw CliError(fmt::format("--kv-type '{}' is not one of: {}", f.kv_type, kv_type_list()));
  auto model = load_model_or_embedded(f.model);
  const ModelConfig& c = model->config();
  const std::string source = f.model.empty()
                                 ? fmt::format("{}, {} bytes inside the kvlm binary", kEmbeddedModelName,
                                               grouped(embedded_model_size()))
                                 : f.model;
  std::printf("== kvlm demo ==\n");
  std::printf("model    %s\n", source.c_str());
  std::printf("         %s %s: %d layers, dim %d, %d query heads / %d kv heads, head_dim %d, vocab %d\n",
              c.architecture.c_str(), c.attention_kind().c_str(), c.num_layers, c.dim, c.num_heads, c.num_kv_heads,
              c.head_dim, c.vocab_size);

  const Tokenizer& tok = model->tokenizer();
  const std::vector<TokenId> prompt = tok.encode(f.prompt, tok.add_bos());
  if (prompt.empty()) throw CliError("the prompt encodes to no tokens and the vocabulary has no BOS");
  std::printf("prompt   \"%s\" (%zu tokens with BOS), greedy, up to %d new tokens\n\n", f.prompt.c_str(),
              prompt.size(), f.max_tokens);

  ThreadPool pool(resolve_threads(f.threads));
  Generator generator(*model, pool);
  const std::vector<CacheRun> runs = {generate_with(generator, *model, prompt, KvType::kF32, f.max_tokens),
                                      generate_with(generator, *model, prompt, *quantized, f.max_tokens)};
  const CacheRun& exact = runs[0];
  const CacheRun& coded = runs[1];
  std::printf("%s\n\n", exact.result.text.c_str());

  const int divergence = first_difference(exact.result, coded.result, static_cast<int>(prompt.size()));
  if (divergence < 0) {
    std::printf("%s cache: the same text, token for token\n\n", std::string(kv_type_name(coded.type)).c_str());
  } else {
    std::printf("%s cache: parts from the f32 text at new token %d:\n%s\n\n",
                std::string(kv_type_name(coded.type)).c_str(), divergence, coded.result.text.c_str());
  }

  // One row per quantity, one column per cache.
  auto row = [&](const char* label, auto cell) {
    std::string line = fmt::format("{:<28}", label);
    for (const CacheRun& r : runs) line += fmt::format("{:>16}", cell(r.result.stats, r));
    std::printf("%s\n", line.c_str());
  };
  using Stats = GenerationStats;
  row("KV cache", [](const Stats&, const CacheRun& r) { return std::string(kv_type_name(r.type)); });
  row("bytes per token (formula)", [](const Stats& s, const CacheRun&) {
    return grouped(s.kv_bytes_per_token);
  });
  row("tokens cached", [](const Stats& s, const CacheRun&) { return fmt::format("{}", s.kv_tokens_cached); });
  row("formula x tokens", [](const Stats&, const CacheRun& r) {
    return grouped(static_cast<uint64_t>(r.planner.predicted.formula_bytes));
  });
  row("live pool bytes (blocks)", [](const Stats& s, const CacheRun&) {
    return fmt::format("{} ({})", grouped(s.kv_bytes_allocated), s.kv_blocks_peak);
  });
  row("planner vs live pool", [](const Stats&, const CacheRun& r) {
    return std::string(r.planner.agrees() ? "agrees" : "DISAGREES");
  });
  row("max rel. error vs recompute", [](const Stats& s, const CacheRun&) {
    return fmt::format("{:.1e}", s.verify_max_rel_error);
  });
  std::printf("(bytes per token = 2 x %d layers x %d kv heads x %d dims x bytes per value, scales included; "
              "blocks of %d tokens)\n\n",
              c.num_layers, c.num_kv_heads, c.head_dim, kBlockSize);

  const bool exact_ok = exact.result.stats.verify_max_rel_error <= kF32Tolerance;
  const bool books_ok = std::all_of(runs.begin(), runs.end(), [](const CacheRun& r) {
    return r.result.stats.blocks_leaked == 0 && r.planner.agrees();
  });
  const bool ok = exact_ok && books_ok;
  std::printf("check    f32 cached decode == no-cache recomputation within %.0e; no blocks leaked; "
              "planner agrees: %s\n",
              kF32Tolerance, ok ? "PASS" : "FAIL");
  if (!ok) throw CliError("the cached forward disagrees with the recomputation or the planner");
  if (!demo_server(*model, pool)) throw CliError("the server part of the demo did not answer as expected");
}

}  // namespace

CLI::App* add_demo_command(CLI::App& app) {
  auto flags = std::make_shared<DemoFlags>();
  CLI::App* cmd = app.add_subcommand(
      "demo", "Tell a story with the embedded stories260K; show KV bytes per token and the cached-vs-recomputed check");
  cmd->add_option("--model,-m", flags->model,
                  fmt::format("GGUF model file (default: {}, compiled into kvlm)", kEmbeddedModelName));
  cmd->add_option("--prompt,-p", flags->prompt, "the story's opening")->capture_default_str();
  cmd->add_option("--kv-type", flags->kv_type, "the quantized KV cache shown beside f32")->capture_default_str();
  cmd->add_option("--max-tokens,-n", flags->max_tokens, "tokens to generate")->capture_default_str();
  cmd->add_option("--threads,-t", flags->threads, "threads (default: all cores)");
  cmd->callback([flags, cmd] {
    if (cmd->count("--model") > 0 && flags->model.empty()) {
      throw CliError(fmt::format("--model is empty: name a GGUF file, or drop --model for {}", kEmbeddedModelName));
    }
    run(*flags);
  });
  return cmd;
}

}  // namespace kvlm::cli
