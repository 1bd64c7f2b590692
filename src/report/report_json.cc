#include "report/report_data.h"

namespace kvlm {
namespace {

using nlohmann::json;

json option_fields(const ReportOption& o) {
  json j = {{"option", o.label},   {"kv_type_k", o.k_type}, {"kv_type_v", o.v_type},
            {"kivi_residual", o.kivi_residual}, {"policy", o.policy}, {"budget", o.budget}};
  if (o.unrotated) j["keys_rotated"] = false;
  if (o.sinks > 0) j["sinks"] = o.sinks;
  if (o.snapkv_window > 0) j["snapkv_window"] = o.snapkv_window;
  return j;
}

json quality_fields(const QualityRow& r) {
  json row = option_fields(r.option);
  row.update({{"baseline", r.baseline},       {"ppl", r.ppl},         {"ppl_stderr", r.ppl_stderr},
              {"delta_ppl_pct", r.delta_ppl_pct}, {"mean_kld", r.mean_kld}, {"kld_p99", r.kld_p99},
              {"top1_agreement", r.top1_agreement}, {"rms_dp", r.rms_dp}, {"kv_bytes_peak", r.kv_bytes_peak},
              {"tokens_scored", r.tokens_scored}});
  return row;
}

json stream_fields(const StreamRun& run) {
  json row = option_fields(run.option);
  row["overall_ppl"] = run.overall_ppl;
  row["in_context_ppl"] = run.in_context_ppl;
  row["past_context_ppl"] = run.past_context_ppl;
  row["kv_bytes_peak"] = run.kv_bytes_peak;
  row["seconds"] = run.seconds;
  row["segments"] = json::array();
  for (const StreamSegmentRow& s : run.segments) {
    row["segments"].push_back({{"begin", s.begin}, {"end", s.end}, {"ppl", s.ppl}, {"kv_bytes", s.kv_bytes}});
  }
  return row;
}

json recall_fields(const RecallRun& run) {
  json row = option_fields(run.option);
  row.update({{"distances", run.distances}, {"prompt_tokens", run.prompt_tokens}, {"accuracy", run.accuracy},
              {"accuracy_stderr", run.accuracy_stderr}, {"control", run.control}, {"chance", run.chance}});
  return row;
}

}  // namespace

json report_to_json(const ReportData& d) {
  json j;
  j["model"] = {{"name", d.model.name},           {"architecture", d.model.architecture},
                {"num_layers", d.model.num_layers}, {"num_heads", d.model.num_heads},
                {"num_kv_heads", d.model.num_kv_heads}, {"head_dim", d.model.head_dim},
                {"context_length", d.model.context_length}, {"vocab_size", d.model.vocab_size}};
  j["text"] = d.text_name;
  j["text_tokens"] = d.text_tokens;
  j["config_name"] = d.config_name;
  j["config"] = d.config;
  j["machine"] = d.machine;
  j["date"] = d.date;
  j["seconds"] = d.seconds;

  j["memory"] = json::array();
  for (const MemoryRow& r : d.memory) {
    json row = option_fields(r.option);
    row["bytes_per_token"] = r.planned_bytes_per_token;
    row["live_bytes_per_token"] = r.live_bytes_per_token;
    row["ratio_to_f16"] = r.ratio_to_f16;
    row["staging_bytes_per_sequence"] = r.staging_bytes_per_sequence;
    j["memory"].push_back(row);
  }
  j["quality_ctx"] = d.quality_ctx;
  j["quality"] = json::array();
  for (const QualityRow& r : d.quality) j["quality"].push_back(quality_fields(r));
  j["stream_trained_ctx"] = d.stream_trained_ctx;
  j["stream_segment"] = d.stream_segment;
  j["stream"] = json::array();
  for (const StreamRun& run : d.stream) j["stream"].push_back(stream_fields(run));
  j["evict_stream_budget"] = d.evict_stream_budget;
  j["stream_policies"] = json::array();
  for (const StreamRun& run : d.stream_policies) j["stream_policies"].push_back(stream_fields(run));
  j["eviction_memory"] = json::array();
  for (const EvictionMemoryRow& r : d.eviction_memory) {
    json row = option_fields(r.option);
    row.update({{"tokens", r.tokens}, {"planned_bytes", r.planned_bytes}, {"peak_bytes", r.peak_bytes},
                {"full_cache_bytes", r.full_cache_bytes}});
    j["eviction_memory"].push_back(row);
  }
  j["sink_probe"] = json::array();
  for (const SinkProbeRow& r : d.sink_probe) {
    j["sink_probe"].push_back({{"query_begin", r.query_begin}, {"query_end", r.query_end},
                               {"first_token_share", r.first_token_share}, {"uniform_share", r.uniform_share}});
  }
  j["quality_policies"] = json::array();
  for (const QualityRow& r : d.quality_policies) j["quality_policies"].push_back(quality_fields(r));
  j["recall_span"] = d.recall_span;
  j["recall_spans"] = d.recall_text_spans ? "text" : "random";
  j["recall_trials"] = d.recall_trials;
  j["recall"] = json::array();
  for (const RecallRun& run : d.recall) j["recall"].push_back(recall_fields(run));
  j["recall_policies_trials"] = d.recall_policies_trials;
  j["recall_policies"] = json::array();
  for (const RecallRun& run : d.recall_policies) j["recall_policies"].push_back(recall_fields(run));
  j["speed_threads"] = d.speed_threads;
  j["speed_reps"] = d.speed_reps;
  j["speed_gen_tokens"] = d.speed_gen_tokens;
  j["speed"] = json::array();
  for (const SpeedRun& run : d.speed) {
    json row = option_fields(run.option);
    row.update({{"depths", run.depths}, {"tg_tokens_per_second", run.tg_tokens_per_second}, {"tg_stddev", run.tg_stddev},
                {"tg_gb_per_second", run.tg_gb_per_second}, {"pp_tokens_per_second", run.pp_tokens_per_second}});
    j["speed"].push_back(row);
  }
  return j;
}

}  // namespace kvlm
