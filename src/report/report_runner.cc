#include "report/report_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "eval/kld.h"
#include "eval/perplexity.h"
#include "eval/recall_probe.h"
#include "eval/speed_bench.h"
#include "eval/stream_perplexity.h"
#include "kv/kv_storage.h"
#include "kv/kv_type.h"
#include "model/llama_model.h"
#include "plan/kv_planner.h"
#include "plan/model_shape.h"

namespace kvlm {
namespace {

struct OptionTypes {
  KvType k;
  KvType v;
  KvStorageOptions storage;
};

Result<OptionTypes> option_types(const ReportOption& o) {
  const auto k = parse_kv_type(o.k_type);
  const auto v = parse_kv_type(o.v_type);
  if (!k || !v) return Status::errorf("report option '{}' names a codec this build lacks", o.label);
  return OptionTypes{*k, *v, KvStorageOptions{.kivi_residual_tokens = o.kivi_residual}};
}

void say(const ReportProgressFn& progress, const std::string& line) {
  if (progress) progress(line);
}

// Quality: every option's windows against the f32 cache's, token by token (KLD records kept in memory).
Status run_quality(LlamaModel& model, ThreadPool& pool, std::span<const TokenId> tokens, const ReportConfig& config,
                   const ReportProgressFn& progress, ReportData& data) {
  PerplexityOptions options;
  options.ctx = config.ppl_ctx;
  options.block_size = config.block_size;
  options.max_windows = config.ppl_max_windows;
  data.quality_ctx = config.ppl_ctx;

  std::vector<KldRecord> baseline;
  say(progress, fmt::format("quality: f32 baseline, ctx {}", config.ppl_ctx));
  options.k_type = options.v_type = KvType::kF32;
  KVLM_ASSIGN_OR_RETURN(PerplexityResult base,
                        evaluate_perplexity(model, pool, tokens, options, [&](std::span<const double> lp, TokenId t) {
                          baseline.push_back(make_kld_record(lp, t));
                          return Status::ok_status();
                        }));
  QualityRow base_row;
  base_row.option = ReportOption{"f32", "f32", "f32"};
  base_row.baseline = true;
  base_row.ppl = base.stats.ppl;
  base_row.ppl_stderr = base.stats.ppl_stderr;
  base_row.kv_bytes_peak = base.kv_bytes_peak;
  base_row.tokens_scored = base.stats.num_scored;
  data.quality.push_back(base_row);

  for (const ReportOption& option : config.options) {
    KVLM_ASSIGN_OR_RETURN(OptionTypes types, option_types(option));
    if (types.k == KvType::kF32 && types.v == KvType::kF32) continue;  // the baseline itself
    say(progress, fmt::format("quality: {}", option.label));
    options.k_type = types.k;
    options.v_type = types.v;
    options.storage = types.storage;
    KldAccumulator acc;
    size_t next = 0;
    KVLM_ASSIGN_OR_RETURN(PerplexityResult run,
                          evaluate_perplexity(model, pool, tokens, options, [&](std::span<const double> lp, TokenId t) {
                            if (next >= baseline.size() || baseline[next].target != t) {
                              return Status::errorf("quality run of '{}' scored token {} out of step with the baseline",
                                                    option.label, next);
                            }
                            acc.add(baseline[next++], lp);
                            return Status::ok_status();
                          }));
    const KldStats k = acc.finish();
    QualityRow row;
    row.option = option;
    row.ppl = run.stats.ppl;
    row.ppl_stderr = run.stats.ppl_stderr;
    row.delta_ppl_pct = 100.0 * (run.stats.ppl - base.stats.ppl) / base.stats.ppl;
    row.mean_kld = k.mean_kld;
    row.kld_p99 = k.kld_p99;
    row.top1_agreement = k.top1_agreement;
    row.rms_dp = k.rms_dp;
    row.kv_bytes_peak = run.kv_bytes_peak + run.kv_staging_bytes_peak;
    row.tokens_scored = run.stats.num_scored;
    data.quality.push_back(row);
  }
  return Status::ok_status();
}

// Memory: the planner's bytes per token beside a live pool's for the same layout.
Status run_memory(const ModelConfig& mc, const ReportConfig& config, ReportData& data) {
  const ModelShape shape = model_shape_from_config(mc);
  KVLM_ASSIGN_OR_RETURN(KvFootprint f16, kv_footprint(shape, KvType::kF16, KvType::kF16, CacheForm::kFull,
                                                      config.block_size));
  const KvLayout layout{mc.num_layers, mc.num_kv_heads, mc.head_dim, config.block_size};
  for (const ReportOption& option : config.options) {
    KVLM_ASSIGN_OR_RETURN(OptionTypes types, option_types(option));
    KVLM_ASSIGN_OR_RETURN(KvFootprint planned,
                          kv_footprint(shape, types.k, types.v, CacheForm::kFull, config.block_size));
    KVLM_ASSIGN_OR_RETURN(std::unique_ptr<KvStorage> live,
                          KvStorage::create(layout, types.k, types.v, 1, types.storage));
    MemoryRow row;
    row.option = option;
    row.planned_bytes_per_token = static_cast<uint64_t>(std::ceil(planned.bytes_per_token()));
    row.live_bytes_per_token = live->bytes_per_token();
    row.ratio_to_f16 = planned.bytes_per_token() / f16.bytes_per_token();
    row.staging_bytes_per_sequence = planned.staging_bytes_per_sequence(option.kivi_residual);
    data.memory.push_back(row);
  }
  return Status::ok_status();
}

Status run_stream(LlamaModel& model, ThreadPool& pool, std::span<const TokenId> tokens, const ReportConfig& config,
                  const ReportProgressFn& progress, ReportData& data) {
  StreamOptions options;
  options.num_tokens = std::min<int64_t>(config.stream_tokens, static_cast<int64_t>(tokens.size()));
  options.segment = config.stream_segment;
  options.trained_ctx = config.trained_ctx;
  options.cache.block_size = config.block_size;
  data.stream_segment = config.stream_segment;
  for (const ReportOption& option : config.stream_options) {
    KVLM_ASSIGN_OR_RETURN(OptionTypes types, option_types(option));
    say(progress, fmt::format("stream: {}, {} tokens", option.label, options.num_tokens));
    options.cache.k_type = types.k;
    options.cache.v_type = types.v;
    options.cache.storage = types.storage;
    KVLM_ASSIGN_OR_RETURN(StreamResult result, evaluate_stream(model, pool, tokens, options));
    data.stream_trained_ctx = result.trained_ctx;
    StreamRun run;
    run.option = option;
    run.overall_ppl = result.overall.ppl;
    for (const StreamSegment& s : result.segments) {
      run.segments.push_back({s.first_position, s.end_position, s.stats.ppl, s.kv_bytes});
    }
    data.stream.push_back(std::move(run));
  }
  return Status::ok_status();
}

Status run_recall(LlamaModel& model, ThreadPool& pool, std::span<const TokenId> tokens, const ReportConfig& config,
                  const ReportProgressFn& progress, ReportData& data) {
  RecallOptions options;
  options.distances = config.recall_distances;
  options.trials = config.recall_trials;
  options.span = config.recall_span;
  options.span_source = config.recall_text_spans ? SpanSource::kText : SpanSource::kRandomTokens;
  // Distances past the trained context are measured too (and marked in the report).
  options.past_context = PastContext::kAllow;
  options.cache.block_size = config.block_size;
  // Filler: the evaluation text without its BOS.
  const size_t skip = !tokens.empty() && tokens.front() == model.tokenizer().bos_id() ? 1 : 0;
  options.filler.assign(tokens.begin() + static_cast<ptrdiff_t>(skip), tokens.end());
  data.recall_span = config.recall_span;
  data.recall_text_spans = config.recall_text_spans;
  data.recall_trials = config.recall_trials;
  for (const ReportOption& option : config.options) {
    KVLM_ASSIGN_OR_RETURN(OptionTypes types, option_types(option));
    say(progress, fmt::format("recall: {}", option.label));
    options.cache.k_type = types.k;
    options.cache.v_type = types.v;
    options.cache.storage = types.storage;
    KVLM_ASSIGN_OR_RETURN(RecallResult result, run_recall_probe(model, pool, options));
    RecallRun run;
    run.option = option;
    run.chance = result.chance;
    for (const RecallPoint& p : result.points) {
      run.distances.push_back(p.distance);
      run.prompt_tokens.push_back(p.prompt_tokens);
      run.accuracy.push_back(p.accuracy);
      run.accuracy_stderr.push_back(p.accuracy_stderr);
      run.control.push_back(p.control_accuracy);
    }
    data.recall.push_back(std::move(run));
  }
  return Status::ok_status();
}

Status run_speed(LlamaModel& model, ThreadPool& pool, const ReportConfig& config, const ReportProgressFn& progress,
                 ReportData& data) {
  SpeedBenchOptions options;
  options.prompt_tokens = config.bench_prompt;
  options.gen_tokens = config.bench_gen;
  options.depths = config.bench_depths;
  options.reps = config.bench_reps;
  options.block_size = config.block_size;
  data.speed_threads = pool.num_threads();
  data.speed_reps = config.bench_reps;
  data.speed_gen_tokens = config.bench_gen;
  for (const ReportOption& option : config.options) {
    KVLM_ASSIGN_OR_RETURN(OptionTypes types, option_types(option));
    say(progress, fmt::format("speed: {}", option.label));
    options.k_type = types.k;
    options.v_type = types.v;
    options.storage = types.storage;
    KVLM_ASSIGN_OR_RETURN(SpeedBenchResult result, run_speed_bench(model, pool, options));
    SpeedRun run;
    run.option = option;
    for (int depth : config.bench_depths) {
      const SpeedBenchRow* pp = nullptr;
      const SpeedBenchRow* tg = nullptr;
      for (const SpeedBenchRow& row : result.rows) {
        if (row.depth != depth) continue;
        (row.is_generation() ? tg : pp) = &row;
      }
      if (pp == nullptr || tg == nullptr) return Status::errorf("speed bench gave no pp/tg rows at depth {}", depth);
      run.depths.push_back(depth);
      run.tg_tokens_per_second.push_back(tg->mean_tps);
      run.tg_stddev.push_back(tg->stddev_tps);
      run.tg_gb_per_second.push_back(tg->gb_per_s);
      run.pp_tokens_per_second.push_back(pp->mean_tps);
    }
    data.speed.push_back(std::move(run));
  }
  return Status::ok_status();
}

}  // namespace

Result<ReportData> run_report(LlamaModel& model, ThreadPool& pool, std::span<const TokenId> text_tokens,
                              const ReportConfig& config, const ReportProgressFn& progress) {
  const auto start = std::chrono::steady_clock::now();
  const ModelConfig& mc = model.config();
  ReportData data;
  data.model.architecture = mc.architecture;
  data.model.num_layers = mc.num_layers;
  data.model.num_heads = mc.num_heads;
  data.model.num_kv_heads = mc.num_kv_heads;
  data.model.head_dim = mc.head_dim;
  data.model.context_length = mc.context_length;
  data.model.vocab_size = mc.vocab_size;
  data.text_tokens = static_cast<int64_t>(text_tokens.size());
  data.config_name = config.name;
  data.config = report_config_to_json(config);

  KVLM_RETURN_IF_ERROR(run_memory(mc, config, data));
  KVLM_RETURN_IF_ERROR(run_quality(model, pool, text_tokens, config, progress, data));
  KVLM_RETURN_IF_ERROR(run_stream(model, pool, text_tokens, config, progress, data));
  KVLM_RETURN_IF_ERROR(run_recall(model, pool, text_tokens, config, progress, data));
  KVLM_RETURN_IF_ERROR(run_speed(model, pool, config, progress, data));

  data.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return data;
}

}  // namespace kvlm
