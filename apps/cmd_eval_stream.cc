// `kvlm eval stream`: perplexity of one continuous stream past the trained context, per segment.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_error.h"
#include "model_source.h"
#include "commands.h"
#include "eval/evicting_eval_cache.h"
#include "eval/stream_perplexity.h"
#include "evict/evicting_sequence.h"
#include "eviction_flags.h"
#include "kv_flags.h"
#include "model/llama_model.h"
#include "planner_check.h"
#include "text_file.h"
#include "tokenizer_warnings.h"

namespace kvlm::cli {
namespace {

struct StreamFlags {
  std::string model;
  std::string text;
  int64_t tokens = 0;
  int segment = 512;
  int chunk = 256;
  int trained_ctx = 0;
  KvTypeFlags kv;
  EvictionFlags evict;
  int block_size = 16;
  int threads = 0;
  bool json = false;
  bool reference = false;
};

nlohmann::json stats_json(const PerplexityStats& s) {
  return {{"tokens", s.num_scored}, {"mean_nll", s.mean_nll}, {"nll_stderr", s.nll_stderr},
          {"ppl", s.ppl},           {"ppl_stderr", s.ppl_stderr}};
}

void run_stream(const StreamFlags& f) {
  if (f.tokens < 2) throw CliError(fmt::format("--tokens {} must be at least 2", f.tokens));
  const KvType k_type = f.kv.k_type(), v_type = f.kv.v_type();
  const KvStorageOptions storage = f.kv.storage_options();
  const EvictionOptions eviction = f.evict.eviction();
  const std::string text = read_text_file(f.text);
  auto model = load_model_file(f.model);
  const Tokenizer& tok = model->tokenizer();
  print_model_warnings(*model);
  const std::vector<TokenId> tokens = tok.encode(text, tok.add_bos());

  StreamOptions options;
  options.num_tokens = f.tokens;
  options.segment = f.segment;
  options.chunk = f.chunk;
  options.trained_ctx = f.trained_ctx;
  options.cache.k_type = k_type;
  options.cache.v_type = v_type;
  options.cache.storage = storage;
  options.cache.block_size = f.block_size;
  options.make_cache = make_evicting_eval_cache(eviction);
  options.in_context_reference = f.reference;
  const std::string cache_label = describe_eviction(eviction);
  ThreadPool pool(resolve_threads(f.threads));
  const StreamResult r = value_or_throw(evaluate_stream(*model, pool, tokens, options));
  const int64_t peak_tokens = r.kv_cached_peak;
  const PlannerCheck planner = check_against_planner(model->config(), options.cache.k_type, options.cache.v_type,
                                                     f.block_size, {peak_tokens}, r.kv_bytes_peak,
                                                     options.cache.storage.kivi_residual_tokens, 0,
                                                     EvictingSequence::evicted_slot_blocks(eviction));

  if (f.json) {
    nlohmann::json segments = nlohmann::json::array();
    for (const StreamSegment& s : r.segments) {
      segments.push_back({{"index", s.index},
                          {"first_position", s.first_position},
                          {"end_position", s.end_position},
                          {"tokens", s.stats.num_scored},
                          {"mean_nll", s.stats.mean_nll},
                          {"nll_stderr", s.stats.nll_stderr},
                          {"ppl", s.stats.ppl},
                          {"past_context", s.num_past_context > 0},
                          {"positions_past_context", s.num_past_context},
                          {"kv_cached_tokens", s.kv_cached_tokens},
                          {"kv_blocks", s.kv_blocks},
                          {"kv_bytes", s.kv_bytes}});
      if (f.reference) segments.back()["reference_ppl"] = s.reference.ppl;
    }
    nlohmann::json j = {
        {"model", f.model},
        {"text", f.text},
        {"stream_tokens", r.num_tokens},
        {"text_tokens", tokens.size()},
        {"segment", f.segment},
        {"chunk", f.chunk},
        {"trained_ctx", r.trained_ctx},
        {"gguf_context_length", model->config().context_length},
        {"cache", cache_label},
        {"policy", eviction_policy_name(eviction.policy)},
        {"budget", eviction.budget},
        {"kv_type", f.kv.label()},
        {"kv_type_k", kv_type_name(options.cache.k_type)},
        {"kv_type_v", kv_type_name(options.cache.v_type)},
        {"block_size", f.block_size},
        {"threads", pool.num_threads()},
        {"overall", stats_json(r.overall)},
        {"in_context", stats_json(r.in_context)},
        {"past_context", stats_json(r.past_context)},
        {"ppl", r.overall.ppl},
        {"kv_bytes_per_block", r.kv_bytes_per_block},
        {"kv_bytes_peak", r.kv_bytes_peak},
        {"kv_planner", planner.json()},
        {"seconds", r.seconds},
        {"segments", segments},
    };
    if (f.reference) {
      j["reference"] = stats_json(r.reference);
      j["max_segment_excess"] = r.max_segment_excess;
    }
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("stream perplexity: %s, %lld tokens (BOS first), cache %s, kv %s, trained context %d%s: %.2f s\n",
              f.text.c_str(), static_cast<long long>(r.num_tokens), cache_label.c_str(), f.kv.label().c_str(),
              r.trained_ctx,
              f.trained_ctx > 0 ? " (--trained-ctx)" : " (GGUF)", r.seconds);
  std::printf("%7s  %15s  %8s  %10s  %10s  %10s  %8s  %12s  %s\n", "segment", "positions", "tokens", "mean NLL",
              "PPL", f.reference ? "in-context" : "", "KV toks", "KV bytes", "");
  for (const StreamSegment& s : r.segments) {
    const std::string range = fmt::format("{}-{}", s.first_position, s.end_position - 1);
    const char* flag = s.num_past_context == 0                            ? ""
                       : s.num_past_context == s.stats.num_scored ? "past context"
                                                                          : "partly past context";
    const std::string ref = f.reference ? fmt::format("{:.4f}", s.reference.ppl) : std::string();
    std::printf("%7d  %15s  %8lld  %10.4f  %10.4f  %10s  %8lld  %12llu  %s\n", s.index, range.c_str(),
                static_cast<long long>(s.stats.num_scored), s.stats.mean_nll, s.stats.ppl, ref.c_str(),
                static_cast<long long>(s.kv_cached_tokens), static_cast<unsigned long long>(s.kv_bytes), flag);
  }
  std::printf("overall PPL %.4f +/- %.4f over %lld tokens; in context %.4f (%lld); past context %.4f (%lld)\n",
              r.overall.ppl, r.overall.ppl_stderr, static_cast<long long>(r.overall.num_scored), r.in_context.ppl,
              static_cast<long long>(r.in_context.num_scored), r.past_context.ppl,
              static_cast<long long>(r.past_context.num_scored));
  if (f.reference) {
    std::printf("in context (each prediction over at most %d preceding tokens, fresh cache): PPL %.4f; the stream's "
                "worst segment is %+.1f%% from its in-context PPL\n",
                r.trained_ctx, r.reference.ppl, 100 * r.max_segment_excess);
  }
  std::printf("KV: peak %llu bytes held\n", static_cast<unsigned long long>(r.kv_bytes_peak));
  std::printf("%s", planner.line().c_str());
}

}  // namespace

CLI::App* add_eval_stream_command(CLI::App* eval) {
  auto flags = std::make_shared<StreamFlags>();
  CLI::App* cmd = eval->add_subcommand("stream", "Perplexity of one continuous stream past the trained context");
  cmd->add_option("--model,-m", flags->model, "GGUF model file")->required();
  cmd->add_option("--text,-f", flags->text, "text file: the stream is its first --tokens tokens, BOS first")
      ->required();
  cmd->add_option("--tokens,-n", flags->tokens, "stream length in tokens, BOS included")->required();
  cmd->add_option("--segment", flags->segment, "predictions per reported segment")->capture_default_str();
  cmd->add_option("--chunk", flags->chunk, "tokens per forward pass")->capture_default_str();
  cmd->add_option("--trained-ctx", flags->trained_ctx,
                  "context the model was trained on, for the past-context flags (default: the GGUF's)");
  flags->kv.add_to(cmd);
  flags->evict.add_to(cmd);
  cmd->add_option("--block-size", flags->block_size, "tokens per KV block")->capture_default_str();
  cmd->add_option("--threads,-t", flags->threads, "threads (default: all cores)");
  cmd->add_flag("--reference", flags->reference,
                "also score every prediction in context (fresh cache over the trained context) as a yardstick");
  cmd->add_flag("--json", flags->json, "print one JSON object with all numbers");
  cmd->callback([flags] { run_stream(*flags); });
  return cmd;
}

}  // namespace kvlm::cli
