// `kvlm eval recall`: accuracy of retrieving a detail against its distance back in the context.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_error.h"
#include "model_source.h"
#include "text_file.h"
#include "tokenizer_warnings.h"
#include "commands.h"
#include "eval/evicting_eval_cache.h"
#include "eval/recall_probe.h"
#include "eviction_flags.h"
#include "kv_flags.h"
#include "model/llama_model.h"

namespace kvlm::cli {
namespace {

struct RecallFlags {
  std::string model;
  std::string mode = "repeat";
  std::vector<int> distances = {0, 64, 128, 256, 512, 1024};
  int trials = 20;
  int span = 32;
  std::string span_source = "random";
  std::string text;
  uint64_t seed = 1;
  int chunk = 256;
  int trained_ctx = 0;
  bool allow_past_context = false;
  KvTypeFlags kv;
  EvictionFlags evict;
  int block_size = 16;
  int threads = 0;
  bool json = false;
};

// Which of the flags that only repeat mode reads the user gave.
struct RecallFlagsGiven {
  bool span = false;
  bool spans = false;
};

void run_recall(const RecallFlags& f, const RecallFlagsGiven& given) {
  RecallOptions options;
  if (f.mode == "repeat") {
    options.mode = RecallMode::kRepeat;
  } else if (f.mode == "passkey") {
    options.mode = RecallMode::kPasskey;
    for (const auto& [flag_given, flag] : {std::pair{given.span, "--span"}, std::pair{given.spans, "--spans"}}) {
      if (!flag_given) continue;
      throw CliError(fmt::format("{} does nothing with --mode passkey (the detail is a 5-digit pass key, not a "
                                 "span): drop {}, or use --mode repeat",
                                 flag, flag));
    }
  } else {
    throw CliError(fmt::format("--mode '{}' is not one of: repeat, passkey", f.mode));
  }
  if (f.span_source == "random") {
    options.span_source = SpanSource::kRandomTokens;
  } else if (f.span_source == "text") {
    options.span_source = SpanSource::kText;
    if (f.text.empty()) throw CliError("--spans text needs a --text file to draw the spans from");
  } else {
    throw CliError(fmt::format("--spans '{}' is not one of: random, text", f.span_source));
  }
  // A window (with or without sinks) never lets a query see a key farther back than the budget,
  // so prompts past the context are what those policies are for.
  const EvictionOptions eviction = f.evict.eviction();
  const bool runs_past_context =
      eviction.policy == EvictionPolicy::kWindow || eviction.policy == EvictionPolicy::kStreaming;
  const bool allow_past_context = f.allow_past_context || runs_past_context;
  options.past_context = allow_past_context ? PastContext::kAllow : PastContext::kRefuse;
  options.cache.k_type = f.kv.k_type();
  options.cache.v_type = f.kv.v_type();
  options.cache.storage = f.kv.storage_options();
  options.cache.block_size = f.block_size;
  auto model = load_model_file(f.model);
  print_model_warnings(*model);
  if (!f.text.empty()) {
    options.filler = model->tokenizer().encode(read_text_file(f.text), false);
  }
  options.distances = f.distances;
  options.trials = f.trials;
  options.span = f.span;
  options.seed = f.seed;
  options.chunk = f.chunk;
  options.context_limit = f.trained_ctx;
  options.make_cache = make_evicting_eval_cache(eviction);
  ThreadPool pool(resolve_threads(f.threads));
  const RecallResult r = value_or_throw(run_recall_probe(*model, pool, options));
  const bool repeat = options.mode == RecallMode::kRepeat;

  if (f.json) {
    nlohmann::json points = nlohmann::json::array();
    for (const RecallPoint& p : r.points) {
      nlohmann::json j = {{"distance", p.distance},         {"prompt_tokens", p.prompt_tokens},
                          {"past_context", p.past_context}, {"trials", p.num_trials},
                          {"accuracy", p.accuracy},         {"accuracy_stderr", p.accuracy_stderr}};
      if (repeat) {
        j["control_accuracy"] = p.control_accuracy;
        j["control_stderr"] = p.control_stderr;
      } else {
        j["digit_accuracy"] = p.digit_accuracy;
      }
      points.push_back(j);
    }
    nlohmann::json j = {
        {"model", f.model},
        {"mode", f.mode},
        {"filler", f.text.empty() ? (repeat ? "random tokens" : "built-in sentences") : f.text},
        {"trials", r.trials},
        {"span", r.span},
        {"spans", f.span_source},
        {"seed", f.seed},
        {"context_limit", r.context_limit},
        {"allow_past_context", allow_past_context},
        {"cache", describe_eviction(eviction)},
        {"policy", eviction_policy_name(eviction.policy)},
        {"budget", eviction.budget},
        {"kv_type", f.kv.label()},
        {"kv_type_k", kv_type_name(options.cache.k_type)},
        {"kv_type_v", kv_type_name(options.cache.v_type)},
        {"block_size", f.block_size},
        {"chance", r.chance},
        {"kv_bytes_peak", r.kv_bytes_peak},
        {"seconds", r.seconds},
        {"points", points},
    };
    if (repeat) j["candidate_tokens"] = r.num_candidates;
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  if (repeat) {
    std::printf("recall (repeat, %s spans): span %d, %d trials, filler %s, kv %s, cache %s; chance %.4f (1/%d ordinary "
                "tokens)\n",
                f.span_source.c_str(), r.span, r.trials, f.text.empty() ? "random tokens" : f.text.c_str(),
                f.kv.label().c_str(), describe_eviction(eviction).c_str(), r.chance,
                r.num_candidates);
    std::printf("%9s  %8s  %18s  %18s  %s\n", "distance", "prompt", "accuracy", "control", "");
  } else {
    std::printf("recall (passkey): %d trials, filler %s, kv %s; chance %.0e\n", r.trials,
                f.text.empty() ? "built-in sentences" : f.text.c_str(), f.kv.label().c_str(), r.chance);
    std::printf("%9s  %8s  %18s  %14s  %s\n", "distance", "prompt", "exact accuracy", "digits right", "");
  }
  for (const RecallPoint& p : r.points) {
    const std::string acc = fmt::format("{:.3f} +/- {:.3f}", p.accuracy, p.accuracy_stderr);
    const char* flag = p.past_context ? "past context" : "";
    if (repeat) {
      const std::string ctl = fmt::format("{:.3f} +/- {:.3f}", p.control_accuracy, p.control_stderr);
      std::printf("%9d  %8lld  %18s  %18s  %s\n", p.distance, static_cast<long long>(p.prompt_tokens), acc.c_str(),
                  ctl.c_str(), flag);
    } else {
      std::printf("%9d  %8lld  %18s  %14.3f  %s\n", p.distance, static_cast<long long>(p.prompt_tokens), acc.c_str(),
                  p.digit_accuracy, flag);
    }
  }
  std::printf("context limit %d tokens%s; %.2f s\n", r.context_limit,
              allow_past_context ? " (prompts past it allowed)" : "", r.seconds);
}

}  // namespace

CLI::App* add_eval_recall_command(CLI::App* eval) {
  auto flags = std::make_shared<RecallFlags>();
  CLI::App* cmd = eval->add_subcommand("recall", "Recall probe: retrieval accuracy against distance in the context");
  cmd->add_option("--model,-m", flags->model, "GGUF model file")->required();
  cmd->add_option("--mode", flags->mode, "repeat (random span shown twice) or passkey")->capture_default_str();
  cmd->add_option("--distances", flags->distances, "filler tokens between the detail and its recall")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--trials", flags->trials, "trials per distance")->capture_default_str();
  const CLI::Option* span =
      cmd->add_option("--span", flags->span, "tokens per random span (repeat mode)")->capture_default_str();
  const CLI::Option* spans =
      cmd->add_option("--spans", flags->span_source, "repeat mode's spans: random (ordinary tokens) or text")
          ->capture_default_str();
  cmd->add_option("--text,-f", flags->text, "filler text (default: random tokens / built-in sentences)");
  cmd->add_option("--seed", flags->seed, "random seed: the same seed gives the same trials")->capture_default_str();
  cmd->add_option("--chunk", flags->chunk, "tokens per forward pass")->capture_default_str();
  cmd->add_option("--trained-ctx", flags->trained_ctx, "context limit for prompts (default: the GGUF's)");
  cmd->add_flag("--allow-past-context", flags->allow_past_context,
                "run prompts longer than the context limit (implied by --policy window or streaming)");
  flags->kv.add_to(cmd);
  flags->evict.add_to(cmd);
  cmd->add_option("--block-size", flags->block_size, "tokens per KV block")->capture_default_str();
  cmd->add_option("--threads,-t", flags->threads, "threads (default: all cores)");
  cmd->add_flag("--json", flags->json, "print one JSON object with all numbers");
  cmd->callback([flags, span, spans] {
    run_recall(*flags, RecallFlagsGiven{.span = span->count() > 0, .spans = spans->count() > 0});
  });
  return cmd;
}

}  // namespace kvlm::cli
