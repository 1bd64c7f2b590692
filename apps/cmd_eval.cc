// `kvlm eval ppl`: perplexity over fixed windows, and KL divergence against a saved baseline run.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_error.h"
#include "model_source.h"
#include "commands.h"
#include "eval/kld.h"
#include "eval/perplexity.h"
#include "evict/evicting_sequence.h"
#include "eviction_flags.h"
#include "kv/kv_type.h"
#include "kv_flags.h"
#include "mla_flag.h"
#include "model/llama_model.h"
#include "planner_check.h"
#include "text_file.h"
#include "tokenizer_warnings.h"

namespace kvlm::cli {
namespace {

struct PplFlags {
  std::string model;
  std::string text;
  int ctx = 512;
  KvTypeFlags kv;
  EvictionFlags evict;
  MlaFlag mla;
  int block_size = 16;
  int threads = 0;
  int max_chunks = 0;
  int prefill_chunk = 512;
  bool json = false;
  std::string kld_base;  // write a baseline here
  std::string kld;       // compare against this baseline
  bool kld_other_model = false;  // the baseline may come from another model file
};

void run_ppl(const PplFlags& f, bool prefill_chunk_given) {
  const KvType k_type = f.kv.k_type(), v_type = f.kv.v_type();
  if (!f.kld_base.empty() && !f.kld.empty()) throw CliError("--kld-base and --kld cannot be used together");
  if (f.kld_other_model && f.kld.empty()) throw CliError("--kld-other-model needs --kld");
  const KvStorageOptions storage = f.kv.storage_options();
  const EvictionOptions eviction = f.evict.eviction();
  const bool evicting = eviction.policy != EvictionPolicy::kNone;
  if (prefill_chunk_given && evicting) {
    // Under a policy each window's prompt half is fed whole and the policy picks its steps.
    throw CliError(fmt::format("--prefill-chunk does nothing with --policy {}: the policy feeds as many tokens as "
                               "fit --budget at once, then --evict-step at a time; drop --prefill-chunk, or use "
                               "--policy none",
                               eviction_policy_name(eviction.policy)));
  }
  const std::string text = read_text_file(f.text);
  auto model = load_model_file(f.model);
  f.mla.apply(*model, f.model);
  if (evicting && model->config().is_mla() && f.mla.mode == "expanded") {
    throw CliError(fmt::format("--mla expanded attends over every cached token: it cannot run --policy {}",
                               eviction_policy_name(eviction.policy)));
  }
  const Tokenizer& tok = model->tokenizer();
  print_model_warnings(*model);
  const std::vector<TokenId> tokens = tok.encode(text, tok.add_bos());

  PerplexityOptions options;
  options.ctx = f.ctx;
  options.k_type = k_type;
  options.v_type = v_type;
  options.storage = storage;
  options.block_size = f.block_size;
  options.max_windows = f.max_chunks;
  options.prefill_chunk = f.prefill_chunk;
  options.eviction = eviction;

  // What this run would write as a baseline header: the comparison checks it field by field.
  KldHeader header;
  header.vocab = model->config().vocab_size;
  header.ctx = f.ctx;
  header.model_name = std::filesystem::path(f.model).filename().string();
  header.model_size = std::filesystem::file_size(f.model);
  if (f.ctx >= 2) {
    const WindowPlan plan = plan_windows(static_cast<int64_t>(tokens.size()), f.ctx, std::max(0, f.max_chunks));
    header.count = static_cast<uint64_t>(plan.num_scored);
  }

  std::unique_ptr<KldWriter> writer;
  std::unique_ptr<KldReader> reader;
  KldAccumulator acc;
  KldRecord record;
  ScoredTokenFn on_scored;
  if (!f.kld_base.empty()) {
    writer = value_or_throw(KldWriter::create(f.kld_base, header));
    on_scored = [&](std::span<const double> log_probs, TokenId target) {
      return writer->write(make_kld_record(log_probs, target));
    };
  } else if (!f.kld.empty()) {
    reader = value_or_throw(KldReader::open(f.kld));
    if (f.ctx >= 8 && tokens.size() >= static_cast<size_t>(f.ctx)) {
      throw_if_error(reader->check_matches(header, f.kld_other_model));
    }
    on_scored = [&](std::span<const double> log_probs, TokenId target) -> Status {
      KVLM_RETURN_IF_ERROR(reader->read(record));
      if (record.target != target) {
        return Status::errorf("KLD baseline '{}' predicts token {} where this run has {}: made from a different text",
                              f.kld, record.target, target);
      }
      acc.add(record, log_probs);
      return Status::ok_status();
    };
  }

  ThreadPool pool(resolve_threads(f.threads));
  const PerplexityResult r = value_or_throw(evaluate_perplexity(*model, pool, tokens, options, on_scored));
  if (writer) throw_if_error(writer->finish());
  const PerplexityStats& s = r.stats;
  // Windows run one at a time from an empty cache: the peak is one sequence of ctx tokens.
  // Under a policy the peak is what the policy let one window hold at once.
  const int64_t peak_tokens = evicting ? r.eviction.peak_live_tokens : f.ctx;
  const PlannerCheck planner =
      check_against_planner(model->config(), k_type, v_type, f.block_size, {peak_tokens}, r.kv_bytes_peak,
                            options.storage.kivi_residual_tokens, r.kv_staging_bytes_peak,
                            EvictingSequence::evicted_slot_blocks(options.eviction),
                            LocalLayerRun{LocalLayerBlocks::kWindow, std::min(options.prefill_chunk, f.ctx)});

  nlohmann::json j = {
      {"model", f.model},
      {"text", f.text},
      {"ctx", f.ctx},
      {"kv_type", f.kv.label()},
      {"keys_rotated", f.kv.keys_rotated()},
      {"kv_type_k", kv_type_name(k_type)},
      {"kv_type_v", kv_type_name(v_type)},
      {"block_size", f.block_size},
      {"threads", pool.num_threads()},
      {"text_tokens", r.num_text_tokens},
      {"windows", r.plan.num_windows},
      {"tokens_scored", s.num_scored},
      {"mean_nll", s.mean_nll},
      {"nll_stderr", s.nll_stderr},
      {"ppl", s.ppl},
      {"ppl_stderr", s.ppl_stderr},
      {"kv_bytes_per_token", r.kv_bytes_per_token},
      {"kv_bytes_formula", r.kv_bytes_formula},
      {"kv_bytes_peak", r.kv_bytes_peak},
      {"kv_blocks_peak", r.kv_blocks_peak},
      {"kv_planner", planner.json()},
      {"seconds", r.seconds},
      {"cache", describe_eviction(options.eviction)},
      {"policy", eviction_policy_name(options.eviction.policy)},
      {"budget", options.eviction.budget},
  };
  if (evicting) {
    j["eviction"] = {{"tokens_evicted", r.eviction.tokens_evicted},
                     {"peak_live_tokens", r.eviction.peak_live_tokens},
                     {"compactions", r.eviction.compactions},
                     {"tokens_moved", r.eviction.tokens_moved},
                     {"blocks_dropped", r.eviction.blocks_dropped}};
  }
  std::optional<KldStats> k;
  if (reader) {
    k = acc.finish();
    j["kld"] = {
        {"baseline", f.kld},          {"tokens", k->count},          {"mean_kld", k->mean_kld},
        {"kld_stderr", k->kld_stderr}, {"kld_p99", k->kld_p99},      {"max_kld", k->max_kld},
        {"top1_agreement", k->top1_agreement}, {"rms_dp", k->rms_dp}, {"base_ppl", k->base_ppl},
        {"ppl", k->cur_ppl},          {"delta_ppl", k->delta_ppl},
        {"baseline_model", reader->header().model_name},
    };
  }
  if (!f.kld_base.empty()) j["kld_base"] = f.kld_base;
  if (f.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("perplexity: %s, ctx %d, kv %s%s: %d windows, %lld tokens scored (of %lld) in %.2f s\n",
              f.text.c_str(), f.ctx, f.kv.label().c_str(), f.kv.keys_rotated() ? " (keys rotated)" : "",
              r.plan.num_windows, static_cast<long long>(s.num_scored),
              static_cast<long long>(r.num_text_tokens), r.seconds);
  std::printf("PPL = %.4f +/- %.4f   mean NLL = %.6f +/- %.6f\n", s.ppl, s.ppl_stderr, s.mean_nll, s.nll_stderr);
  if (evicting) {
    std::printf("cache: %s; each window's first %d tokens fed as a prompt, then the scored half; %lld tokens "
                "evicted, at most %d live\n",
                describe_eviction(options.eviction).c_str(), f.ctx / 2,
                static_cast<long long>(r.eviction.tokens_evicted), r.eviction.peak_live_tokens);
  }
  std::printf("KV: peak %llu bytes held (%d blocks of %d tokens); formula %llu bytes/token x %d = %llu bytes\n",
              static_cast<unsigned long long>(r.kv_bytes_peak), r.kv_blocks_peak, f.block_size,
              static_cast<unsigned long long>(r.kv_bytes_per_token), f.ctx,
              static_cast<unsigned long long>(r.kv_bytes_formula));
  std::printf("%s", planner.line().c_str());
  if (k) {
    std::printf("vs baseline %s (model %s): base PPL %.4f, dPPL %+.6f\n", f.kld.c_str(),
                reader->header().model_name.c_str(), k->base_ppl, k->delta_ppl);
    std::printf("KLD mean %.6g +/- %.2g, p99 %.6g, max %.6g; top-1 agreement %.4f%%; RMS dp %.4f%%\n", k->mean_kld,
                k->kld_stderr, k->kld_p99, k->max_kld, 100 * k->top1_agreement, 100 * k->rms_dp);
  }
  if (!f.kld_base.empty()) std::printf("baseline log-probs saved to %s\n", f.kld_base.c_str());
}

}  // namespace

CLI::App* add_eval_command(CLI::App& app) {
  CLI::App* eval = app.add_subcommand("eval", "Evaluate a model: perplexity, KL divergence vs a baseline");
  eval->require_subcommand(1);
  auto flags = std::make_shared<PplFlags>();
  CLI::App* cmd = eval->add_subcommand("ppl", "Perplexity over fixed windows (llama.cpp's convention)");
  cmd->add_option("--model,-m", flags->model, "GGUF model file")->required();
  cmd->add_option("--text,-f", flags->text, "text file to evaluate")->required();
  cmd->add_option("--ctx,-c", flags->ctx, "tokens per window")->capture_default_str();
  flags->kv.add_to(cmd);
  flags->evict.add_to(cmd);
  flags->mla.add_to(cmd);
  cmd->add_option("--block-size", flags->block_size, "tokens per KV block")->capture_default_str();
  cmd->add_option("--threads,-t", flags->threads, "threads (default: all cores)");
  cmd->add_option("--max-chunks", flags->max_chunks, "evaluate at most this many windows; 0 = all")
      ->capture_default_str();
  const CLI::Option* prefill_chunk =
      cmd->add_option("--prefill-chunk", flags->prefill_chunk, "tokens per forward pass (--policy none)")
          ->capture_default_str();
  cmd->add_flag("--json", flags->json, "print one JSON object with all numbers");
  cmd->add_option("--kld-base", flags->kld_base, "save this run's log-probabilities as a KLD baseline");
  cmd->add_option("--kld", flags->kld, "compare against a baseline saved with --kld-base");
  cmd->add_flag("--kld-other-model", flags->kld_other_model,
                "--kld: the baseline may come from another model file of the same vocabulary (e.g. a quantized "
                "file against its F32 original); tokens must still match one for one");
  cmd->callback([flags, prefill_chunk] { run_ppl(*flags, prefill_chunk->count() > 0); });
  add_eval_stream_command(eval);
  add_eval_recall_command(eval);
  return eval;
}

}  // namespace kvlm::cli
