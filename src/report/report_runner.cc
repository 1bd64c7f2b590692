#include "report/report_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "cache/kv_cache_manager.h"
#include "eval/evicting_eval_cache.h"
#include "eval/kld.h"
#include "eval/perplexity.h"
#include "eval/recall_probe.h"
#include "eval/speed_bench.h"
#include "eval/stream_perplexity.h"
#include "evict/eviction_options.h"
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
  KvStorageOptions storage{.kivi_residual_tokens = o.kivi_residual};
  if (o.unrotated) storage.rotate_keys = false;
  return OptionTypes{*k, *v, storage};
}

// The option's eviction policy as the evaluations take it (kNone for the full cache).
Result<EvictionOptions> eviction_of(const ReportOption& o) {
  EvictionOptions e;
  KVLM_ASSIGN_OR_RETURN(e.policy, parse_eviction_policy(o.policy));
  if (e.policy == EvictionPolicy::kNone) return e;
  e.budget = o.budget;
  if (o.sinks > 0) e.sinks = o.sinks;
  if (o.snapkv_window > 0) e.snapkv_window = o.snapkv_window;
  const Status valid = validate_eviction_options(e);
  if (!valid.ok()) return Status::errorf("report option '{}': {}", o.label, valid.message());
  return e;
}

// The stream's and the recall probe's cache for one option: its codecs and its policy.
Status set_eval_cache(const ReportOption& option, EvalCacheOptions& cache, EvalCacheFactory& make_cache) {
  KVLM_ASSIGN_OR_RETURN(OptionTypes types, option_types(option));
  KVLM_ASSIGN_OR_RETURN(EvictionOptions eviction, eviction_of(option));
  cache.k_type = types.k;
  cache.v_type = types.v;
  cache.storage = types.storage;
  make_cache = make_evicting_eval_cache(eviction);
  return Status::ok_status();
}

void say(const ReportProgressFn& progress, const std::string& line) {
  if (progress) progress(line);
}

// One option's windows compared token by token with the baseline's records.
Result<QualityRow> quality_row(LlamaModel& model, ThreadPool& pool, std::span<const TokenId> tokens,
                               PerplexityOptions options, const ReportOption& option,
                               std::span<const KldRecord> baseline, double base_ppl) {
  KVLM_ASSIGN_OR_RETURN(OptionTypes types, option_types(option));
  KVLM_ASSIGN_OR_RETURN(options.eviction, eviction_of(option));
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
  row.delta_ppl_pct = 100.0 * (run.stats.ppl - base_ppl) / base_ppl;
  row.mean_kld = k.mean_kld;
  row.kld_p99 = k.kld_p99;
  row.top1_agreement = k.top1_agreement;
  row.rms_dp = k.rms_dp;
  row.kv_bytes_peak = run.kv_bytes_peak + run.kv_staging_bytes_peak;
  row.tokens_scored = run.stats.num_scored;
  return row;
}

PerplexityOptions quality_options(const ReportConfig& config) {
  PerplexityOptions options;
  options.ctx = config.ppl_ctx;
  options.block_size = config.block_size;
  options.max_windows = config.ppl_max_windows;
  return options;
}

// Quality: every option's windows against the f32 cache's, token by token (KLD records kept in memory).
// `baseline` receives the f32 full cache's records, which the eviction rows are compared with too.
Status run_quality(LlamaModel& model, ThreadPool& pool, std::span<const TokenId> tokens, const ReportConfig& config,
                   const ReportProgressFn& progress, ReportData& data, std::vector<KldRecord>& baseline) {
  PerplexityOptions options = quality_options(config);
  data.quality_ctx = config.ppl_ctx;

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
    KVLM_ASSIGN_OR_RETURN(QualityRow row, quality_row(model, pool, tokens, options, option, baseline, base.stats.ppl));
    data.quality.push_back(std::move(row));
  }
  return Status::ok_status();
}

// Quality under eviction: each policy and budget against the same f32 full-cache baseline.
Status run_quality_policies(LlamaModel& model, ThreadPool& pool, std::span<const TokenId> tokens,
                            const ReportConfig& config, const ReportProgressFn& progress,
                            std::span<const KldRecord> baseline, ReportData& data) {
  if (data.quality.empty() || !data.quality.front().baseline) return Status::ok_status();
  const PerplexityOptions options = quality_options(config);
  const double base_ppl = data.quality.front().ppl;
  for (const ReportOption& option : quality_policy_options(config)) {
    say(progress, fmt::format("quality: {}", option.label));
    KVLM_ASSIGN_OR_RETURN(QualityRow row, quality_row(model, pool, tokens, options, option, baseline, base_ppl));
    data.quality_policies.push_back(std::move(row));
  }
  return Status::ok_status();
}

// Memory: the planner's bytes per token beside a live pool's for the same layout.
Status run_memory(const ModelConfig& mc, const ReportConfig& config, ReportData& data) {
  const ModelShape shape = model_shape_from_config(mc);
  KVLM_ASSIGN_OR_RETURN(KvFootprint f16, kv_footprint(shape, KvType::kF16, KvType::kF16, CacheForm::kFull,
                                                      config.block_size));
  const KvLayout layout = mc.kv_layout(config.block_size);
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

StreamOptions stream_options(const ReportConfig& config, std::span<const TokenId> tokens) {
  StreamOptions options;
  options.num_tokens = std::min<int64_t>(config.stream_tokens, static_cast<int64_t>(tokens.size()));
  options.segment = config.stream_segment;
  options.trained_ctx = config.trained_ctx;
  options.cache.block_size = config.block_size;
  return options;
}

Result<StreamRun> stream_run(LlamaModel& model, ThreadPool& pool, std::span<const TokenId> tokens,
                             StreamOptions options, const ReportOption& option, ReportData& data) {
  KVLM_RETURN_IF_ERROR(set_eval_cache(option, options.cache, options.make_cache));
  KVLM_ASSIGN_OR_RETURN(StreamResult result, evaluate_stream(model, pool, tokens, options));
  data.stream_trained_ctx = result.trained_ctx;
  StreamRun run;
  run.option = option;
  run.overall_ppl = result.overall.ppl;
  run.in_context_ppl = result.in_context.ppl;
  run.past_context_ppl = result.past_context.num_scored > 0 ? result.past_context.ppl : 0.0;
  run.kv_bytes_peak = result.kv_bytes_peak;
  run.seconds = result.seconds;
  for (const StreamSegment& s : result.segments) {
    run.segments.push_back({s.first_position, s.end_position, s.stats.ppl, s.kv_bytes});
  }
  return run;
}

Status run_stream(LlamaModel& model, ThreadPool& pool, std::span<const TokenId> tokens, const ReportConfig& config,
                  const ReportProgressFn& progress, ReportData& data) {
  const StreamOptions options = stream_options(config, tokens);
  data.stream_segment = config.stream_segment;
  for (const ReportOption& option : config.stream_options) {
    say(progress, fmt::format("stream: {}, {} tokens", option.label, options.num_tokens));
    KVLM_ASSIGN_OR_RETURN(StreamRun run, stream_run(model, pool, tokens, options, option, data));
    data.stream.push_back(std::move(run));
  }
  return Status::ok_status();
}

// The same stream under each policy at evict_budget (f32), beside the f32 full cache's run
// (reused from the codec streams when there is one), and the bytes each held.
Status run_stream_policies(LlamaModel& model, ThreadPool& pool, std::span<const TokenId> tokens,
                           const ReportConfig& config, const ReportProgressFn& progress, ReportData& data) {
  const std::vector<ReportOption> policies = stream_policy_options(config);
  if (policies.empty()) return Status::ok_status();
  const StreamOptions options = stream_options(config, tokens);
  data.stream_segment = config.stream_segment;
  data.evict_stream_budget = config.evict_budget;
  StreamRun full;
  const auto reused = std::find_if(data.stream.begin(), data.stream.end(), [](const StreamRun& r) {
    return r.option.k_type == "f32" && r.option.v_type == "f32" && !r.option.evicts();
  });
  if (reused != data.stream.end()) {
    full = *reused;
  } else {
    say(progress, fmt::format("stream: f32 full cache, {} tokens", options.num_tokens));
    KVLM_ASSIGN_OR_RETURN(full, stream_run(model, pool, tokens, options, ReportOption{"f32", "f32", "f32"}, data));
  }
  full.option.label = "full";
  data.stream_policies.push_back(std::move(full));
  for (const ReportOption& option : policies) {
    say(progress, fmt::format("stream: {}, {} tokens", option.label, options.num_tokens));
    KVLM_ASSIGN_OR_RETURN(StreamRun run, stream_run(model, pool, tokens, options, option, data));
    data.stream_policies.push_back(std::move(run));
  }

  // Bytes held: the planner's bound for the budget (KvOption::resident_tokens) beside the peak.
  const ModelShape shape = model_shape_from_config(model.config());
  KVLM_ASSIGN_OR_RETURN(KvFootprint f32, kv_footprint(shape, KvType::kF32, KvType::kF32, CacheForm::kFull,
                                                      config.block_size));
  const int64_t tokens_fed = options.num_tokens;
  for (const StreamRun& run : data.stream_policies) {
    KvOption planned;
    planned.k_type = planned.v_type = KvType::kF32;
    planned.policy = run.option.evicts() ? run.option.policy : "full";
    planned.token_budget = run.option.budget;
    EvictionMemoryRow row;
    row.option = run.option;
    row.tokens = tokens_fed;
    row.planned_bytes = static_cast<uint64_t>(std::ceil(planned.resident_tokens(tokens_fed) * f32.bytes_per_token()));
    row.peak_bytes = run.kv_bytes_peak;
    row.full_cache_bytes = static_cast<uint64_t>(std::ceil(tokens_fed * f32.bytes_per_token()));
    data.eviction_memory.push_back(row);
  }
  return Status::ok_status();
}

// Attention the first token receives: one prompt up to query_begin, then the queries as a second
// step whose attention weights (summed over queries, heads and layers) the model adds per slot.
Status run_sink_probe(LlamaModel& model, ThreadPool& pool, std::span<const TokenId> tokens, const ReportConfig& config,
                      const ReportProgressFn& progress, ReportData& data) {
  const ModelConfig& mc = model.config();
  for (const auto& [begin, end] : config.sink_probe_queries) {
    if (begin < 1 || end <= begin || end > static_cast<int64_t>(tokens.size()) || end > mc.context_length) {
      return Status::errorf("sink probe queries [{}, {}) do not fit a text of {} tokens and a context of {}", begin,
                            end, tokens.size(), mc.context_length);
    }
    say(progress, fmt::format("attention sinks: queries {}-{}", begin, end));
    const int bs = config.block_size;
    const int num_blocks = (end + bs - 1) / bs;
    const KvLayout layout = mc.kv_layout(bs);
    KVLM_ASSIGN_OR_RETURN(std::unique_ptr<KvStorage> storage,
                          KvStorage::create(layout, KvType::kF32, KvType::kF32, num_blocks, {}));
    KvCacheManager cache(num_blocks, bs);
    const SeqId seq = cache.create_sequence();
    if (!cache.reserve(seq, end)) return Status::errorf("sink probe: no room for {} tokens", end);
    std::vector<float> logits;
    model.forward(SequenceStep{tokens.subspan(0, begin), 0, cache.table(seq).block_ids(), LogitsRows::kLast}, *storage,
                  pool, logits);
    cache.append(seq, begin);
    std::vector<float> weights(static_cast<size_t>(end), 0.0f);  // [end]: summed over queries, heads, layers
    SequenceStep step{tokens.subspan(begin, end - begin), begin, cache.table(seq).block_ids(), LogitsRows::kLast};
    step.slot_weights = weights.data();
    step.num_weight_queries = end - begin;
    model.forward(step, *storage, pool, logits);
    cache.append(seq, end - begin);
    cache.free_sequence(seq);  // f32 blocks: no staging for the storage to drop
    double total = 0;
    for (float w : weights) total += w;
    SinkProbeRow row;
    row.query_begin = begin;
    row.query_end = end;
    row.first_token_share = total > 0 ? weights[0] / total : 0.0;
    for (int q = begin; q < end; ++q) row.uniform_share += 1.0 / (q + 1);
    row.uniform_share /= end - begin;
    data.sink_probe.push_back(row);
  }
  return Status::ok_status();
}

RecallOptions recall_options(LlamaModel& model, std::span<const TokenId> tokens, const ReportConfig& config) {
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
  return options;
}

Result<RecallRun> recall_run(LlamaModel& model, ThreadPool& pool, RecallOptions options, const ReportOption& option) {
  KVLM_RETURN_IF_ERROR(set_eval_cache(option, options.cache, options.make_cache));
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
  return run;
}

Status run_recall(LlamaModel& model, ThreadPool& pool, std::span<const TokenId> tokens, const ReportConfig& config,
                  const ReportProgressFn& progress, ReportData& data) {
  const RecallOptions options = recall_options(model, tokens, config);
  data.recall_span = config.recall_span;
  data.recall_text_spans = config.recall_text_spans;
  data.recall_trials = config.recall_trials;
  for (const ReportOption& option : config.options) {
    say(progress, fmt::format("recall: {}", option.label));
    KVLM_ASSIGN_OR_RETURN(RecallRun run, recall_run(model, pool, options, option));
    data.recall.push_back(std::move(run));
  }
  return Status::ok_status();
}

// Recall with details quantized (full caches of several codecs) against details evicted
// (policies whose budget the distances cross), on the same trials.
Status run_recall_policies(LlamaModel& model, ThreadPool& pool, std::span<const TokenId> tokens,
                           const ReportConfig& config, const ReportProgressFn& progress, ReportData& data) {
  const std::vector<ReportOption> options_list = recall_policy_options(config);
  if (options_list.empty() || config.recall_evict_distances.empty()) return Status::ok_status();
  RecallOptions options = recall_options(model, tokens, config);
  options.distances = config.recall_evict_distances;
  options.trials = config.recall_evict_trials;
  data.recall_span = config.recall_span;
  data.recall_text_spans = config.recall_text_spans;
  data.recall_policies_trials = config.recall_evict_trials;
  for (const ReportOption& option : options_list) {
    say(progress, fmt::format("recall: {} (distances up to {})", option.label, options.distances.back()));
    KVLM_ASSIGN_OR_RETURN(RecallRun run, recall_run(model, pool, options, option));
    data.recall_policies.push_back(std::move(run));
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
    options.codecs = {SpeedBenchCodec{types.k, types.v, types.storage}};
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
  {
    std::vector<KldRecord> baseline;  // the f32 full cache's distributions, per scored token
    KVLM_RETURN_IF_ERROR(run_quality(model, pool, text_tokens, config, progress, data, baseline));
    KVLM_RETURN_IF_ERROR(run_quality_policies(model, pool, text_tokens, config, progress, baseline, data));
  }
  KVLM_RETURN_IF_ERROR(run_stream(model, pool, text_tokens, config, progress, data));
  KVLM_RETURN_IF_ERROR(run_stream_policies(model, pool, text_tokens, config, progress, data));
  KVLM_RETURN_IF_ERROR(run_sink_probe(model, pool, text_tokens, config, progress, data));
  KVLM_RETURN_IF_ERROR(run_recall(model, pool, text_tokens, config, progress, data));
  KVLM_RETURN_IF_ERROR(run_recall_policies(model, pool, text_tokens, config, progress, data));
  KVLM_RETURN_IF_ERROR(run_speed(model, pool, config, progress, data));

  data.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return data;
}

}  // namespace kvlm
