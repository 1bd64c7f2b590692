// `kvlm run`: generate text from a prompt (or from BOS) over the paged KV cache.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "cli_error.h"
#include "commands.h"
#include "engine/generator.h"
#include "kv/kv_type.h"
#include "eviction_flags.h"
#include "kv_flags.h"
#include "model/llama_model.h"
#include "model_source.h"
#include "run_report.h"
#include "tokenizer_warnings.h"

namespace kvlm::cli {
namespace {

struct RunFlags {
  std::string model;
  std::string prompt;
  bool has_prompt = false;
  int max_tokens = 256;
  float temperature = 0.8f;
  int top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;
  int64_t seed = -1;
  KvTypeFlags kv;
  EvictionFlags evict;
  int block_size = 16;
  int threads = 0;
  bool stats = false;
  bool json = false;
  bool verify = false;
  bool ignore_eos = false;
  bool special = false;  // parse control-token text in the prompt
  bool quiet = false;    // no tokenizer warnings
};

// Which of the flags that only some requests read the user gave.
struct RunFlagsGiven {
  bool top_k = false;
  bool top_p = false;
  bool min_p = false;
  bool seed = false;
  bool stats = false;
};

// A flag that would do nothing in this request is an error naming both flags.
void check_flags_used(const RunFlags& f, const RunFlagsGiven& given) {
  if (f.temperature <= 0.0f) {
    for (const auto& [flag_given, flag] : {std::pair{given.top_k, "--top-k"}, std::pair{given.top_p, "--top-p"},
                                           std::pair{given.min_p, "--min-p"}, std::pair{given.seed, "--seed"}}) {
      if (!flag_given) continue;
      throw CliError(fmt::format("{} does nothing with --temp {} (greedy: always the most likely token): drop {}, "
                                 "or sample with --temp > 0",
                                 flag, f.temperature, flag));
    }
  }
  if (given.stats && f.json) {
    throw CliError("--stats does nothing with --json: the JSON object already holds the statistics; drop --stats, or "
                   "drop --json for text with the statistics on stderr");
  }
}

void run(const RunFlags& f, const RunFlagsGiven& given) {
  check_flags_used(f, given);
  // Every flag is resolved before the model loads, so a bad one fails at once.
  const KvType k_type = f.kv.k_type(), v_type = f.kv.v_type();
  const KvStorageOptions storage = f.kv.storage_options();
  const EvictionOptions eviction = f.evict.eviction();
  auto model = load_model_or_embedded(f.model);
  const Tokenizer& tok = model->tokenizer();
  if (!f.quiet) print_model_warnings(*model);
  std::vector<TokenId> prompt =
      f.has_prompt ? tok.encode(f.prompt, tok.add_bos(), f.special ? SpecialTokens::kParse : SpecialTokens::kAsText)
                   : std::vector<TokenId>{tok.bos_id()};
  if (prompt.empty()) throw CliError("the prompt encodes to no tokens and the vocabulary has no BOS");

  GenerationOptions options;
  options.max_tokens = f.max_tokens;
  options.sampler.temperature = f.temperature;
  options.sampler.top_k = f.top_k;
  options.sampler.top_p = f.top_p;
  options.sampler.min_p = f.min_p;
  options.sampler.repeat_penalty = f.repeat_penalty;
  options.sampler.seed = f.seed >= 0 ? static_cast<uint64_t>(f.seed)
                                     : static_cast<uint64_t>(
                                           std::chrono::steady_clock::now().time_since_epoch().count());
  options.k_type = k_type;
  options.v_type = v_type;
  options.storage = storage;
  options.block_size = f.block_size;
  options.verify = f.verify;
  options.stop_at_eos = !f.ignore_eos;
  options.eviction = eviction;

  ThreadPool pool(resolve_threads(f.threads));
  Generator generator(*model, pool);
  Generator::TextCallback print = [](std::string_view text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  };
  auto result = value_or_throw(generator.generate(prompt, options, f.json ? Generator::TextCallback{} : print));

  const RunDescription desc{model_display_name(f.model), options.k_type, options.v_type, options.sampler.seed,
                            options.storage.kivi_residual_tokens, options.eviction, options.prefill_chunk};
  if (f.json) {
    std::printf("%s\n", stats_to_json(result, *model, desc).dump(2).c_str());
    return;
  }
  std::printf("\n");
  if (f.stats || f.verify) std::fprintf(stderr, "\n%s", format_stats(result, *model, desc).c_str());
}

}  // namespace

CLI::App* add_run_command(CLI::App& app) {
  auto flags = std::make_shared<RunFlags>();
  CLI::App* cmd = app.add_subcommand("run", "Generate text with a GGUF model");
  cmd->add_option("--model,-m", flags->model,
                  fmt::format("GGUF model file (default: {}, compiled into kvlm)", kEmbeddedModelName));
  cmd->add_option("--prompt,-p", flags->prompt, "prompt text (default: start from BOS alone)");
  cmd->add_option("--max-tokens,-n", flags->max_tokens,
                  "new tokens to generate (llama2.c's -n from BOS); also stops at EOS or a full context (window and "
                  "streaming policies run past it); "
                  "0 = until EOS or the context is full")
      ->capture_default_str();
  cmd->add_option("--temp", flags->temperature, "sampling temperature; 0 = greedy")->capture_default_str();
  const CLI::Option* top_k =
      cmd->add_option("--top-k", flags->top_k, "keep the k most likely tokens; 0 = off")->capture_default_str();
  const CLI::Option* top_p =
      cmd->add_option("--top-p", flags->top_p, "nucleus sampling threshold; 1 = off")->capture_default_str();
  const CLI::Option* min_p =
      cmd->add_option("--min-p", flags->min_p, "drop tokens below min-p x the top probability; 0 = off")
          ->capture_default_str();
  cmd->add_option("--repeat-penalty", flags->repeat_penalty, "penalty for recently seen tokens; 1 = off")
      ->capture_default_str();
  const CLI::Option* seed = cmd->add_option("--seed", flags->seed, "RNG seed (default: from the clock)");
  flags->kv.add_to(cmd);
  flags->evict.add_to(cmd);
  cmd->add_option("--block-size", flags->block_size, "tokens per KV block")->capture_default_str();
  cmd->add_option("--threads,-t", flags->threads, "threads (default: all cores)");
  cmd->add_flag("--ignore-eos", flags->ignore_eos, "keep generating through EOS (and BOS) until --max-tokens");
  const CLI::Option* stats =
      cmd->add_flag("--stats", flags->stats, "print speed, cache savings and KV memory to stderr");
  cmd->add_flag("--special", flags->special,
                "parse control-token text in the prompt (\"<|eot_id|>\", \"<s>\") as those tokens; user-defined "
                "tokens (\"<think>\") are always whole tokens");
  cmd->add_flag("--quiet,-q", flags->quiet, "do not print the tokenizer's warnings on stderr");
  cmd->add_flag("--json", flags->json, "print one JSON object with the text, token ids and statistics");
  cmd->add_flag("--verify", flags->verify,
                "check every step's logits against a no-cache reference forward (slow; small models)");
  cmd->callback([flags, cmd, top_k, top_p, min_p, seed, stats] {
    flags->has_prompt = cmd->count("--prompt") > 0;
    if (cmd->count("--model") > 0 && flags->model.empty()) {
      throw CliError(fmt::format("--model is empty: name a GGUF file, or drop --model for {}", kEmbeddedModelName));
    }
    run(*flags, RunFlagsGiven{.top_k = top_k->count() > 0,
                              .top_p = top_p->count() > 0,
                              .min_p = min_p->count() > 0,
                              .seed = seed->count() > 0,
                              .stats = stats->count() > 0});
  });
  return cmd;
}

}  // namespace kvlm::cli
