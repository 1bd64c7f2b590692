// ReportData: every number one `kvlm report` run measured, section by section.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvlm {

// One KV configuration the report compares: a codec for K and for V, and a token-eviction
// policy with its budget ("none": the full cache).
struct ReportOption {
  std::string label;   // "f16", "int8/int4" (K/V), "h2o b64 + kivi4 r16"
  std::string k_type;  // codec names as `--kv-type-k` takes them
  std::string v_type;
  int kivi_residual = 0;  // KIVI codecs: newest tokens kept in full precision
  bool unrotated = false;  // keys stored without the Hadamard rotation their codec defaults to (`--kv-rotate off`)
  std::string policy = "none";  // eviction policy as `--policy` takes it
  int budget = 0;               // tokens attention sees (`--budget`); 0 with "none"
  int sinks = 0;                // streaming: first tokens always kept
  int snapkv_window = 0;        // snapkv: last prompt tokens whose attention votes

  bool evicts() const { return policy != "none"; }
};

struct MemoryRow {
  ReportOption option;
  uint64_t planned_bytes_per_token = 0;  // the planner's formula
  uint64_t live_bytes_per_token = 0;     // KvStorage of the same layout
  double ratio_to_f16 = 0;               // planned bytes / the f16 cache's bytes
  uint64_t staging_bytes_per_sequence = 0;  // KIVI: f32 tail + residual blocks, beside the blocks
};

struct QualityRow {
  ReportOption option;
  bool baseline = false;  // the f32 cache every other row is compared with
  double ppl = 0;
  double ppl_stderr = 0;
  double delta_ppl_pct = 0;  // 100 * (ppl - base) / base
  double mean_kld = 0;
  double kld_p99 = 0;
  double top1_agreement = 0;
  double rms_dp = 0;
  uint64_t kv_bytes_peak = 0;  // the live pool's peak during the run: blocks + KIVI staging
  int64_t tokens_scored = 0;
};

struct StreamSegmentRow {
  int64_t begin = 0;  // first predicted position of the segment
  int64_t end = 0;    // one past the last
  double ppl = 0;
  uint64_t kv_bytes = 0;  // held by the live pool at the segment's end
};

struct StreamRun {
  ReportOption option;
  double overall_ppl = 0;
  std::vector<StreamSegmentRow> segments;
  double in_context_ppl = 0;    // predictions at positions < the trained context
  double past_context_ppl = 0;  // predictions at positions >= it (0 when there are none)
  uint64_t kv_bytes_peak = 0;   // most bytes the live pool held, measured after every forward
  double seconds = 0;
};

// Bytes one sequence holds under an eviction policy, against the planner's bound for its budget.
struct EvictionMemoryRow {
  ReportOption option;
  int64_t tokens = 0;             // tokens fed (the stream's length)
  uint64_t planned_bytes = 0;     // planner: resident tokens (min(tokens, budget)) x bytes per token
  uint64_t peak_bytes = 0;        // the stream run's measured peak
  uint64_t full_cache_bytes = 0;  // planner: every token kept, for comparison
};

// Share of attention the first token receives, over all layers and heads: a model whose queries
// put much more than the uniform share there uses it as an attention sink (StreamingLLM).
struct SinkProbeRow {
  int query_begin = 0;  // positions of the queries averaged over: [query_begin, query_end)
  int query_end = 0;
  double first_token_share = 0;  // mean over queries and heads of the weight on position 0
  double uniform_share = 0;      // the same mean if every query spread its weight evenly: mean 1/(q+1)
};

struct RecallRun {
  ReportOption option;
  std::vector<int> distances;
  std::vector<int64_t> prompt_tokens;  // per distance: the probe's prompt length
  std::vector<double> accuracy;
  std::vector<double> accuracy_stderr;
  std::vector<double> control;  // same prompt shape without the first copy: the model's prior
  double chance = 0;
};

struct SpeedRun {
  ReportOption option;
  std::vector<int> depths;
  std::vector<double> tg_tokens_per_second;
  std::vector<double> tg_stddev;
  std::vector<double> tg_gb_per_second;
  std::vector<double> pp_tokens_per_second;
};

struct ReportModel {
  std::string name;  // file name
  std::string architecture;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int context_length = 0;
  int vocab_size = 0;
};

struct ReportData {
  ReportModel model;
  std::string text_name;
  int64_t text_tokens = 0;
  std::string config_name;  // "quick" or "full"
  nlohmann::json config;    // every knob the run used
  std::string machine;      // CPU features and threads, one line
  std::string date;         // UTC, when the report was made
  double seconds = 0;       // wall time of the whole run

  std::vector<MemoryRow> memory;
  int quality_ctx = 0;
  std::vector<QualityRow> quality;
  int stream_trained_ctx = 0;
  int stream_segment = 0;
  std::vector<StreamRun> stream;
  int recall_span = 0;
  bool recall_text_spans = false;  // spans cut from the text, else random ordinary tokens
  int recall_trials = 0;
  std::vector<RecallRun> recall;

  // Token eviction (policies at a budget, measured with the instruments above).
  int evict_stream_budget = 0;
  std::vector<StreamRun> stream_policies;  // the full cache first, then one run per policy
  std::vector<EvictionMemoryRow> eviction_memory;
  std::vector<SinkProbeRow> sink_probe;
  std::vector<QualityRow> quality_policies;  // against the f32 full-cache baseline of `quality`
  int recall_policies_trials = 0;
  std::vector<RecallRun> recall_policies;   // the full caches first, then the policies

  int speed_threads = 0;
  int speed_reps = 0;
  int speed_gen_tokens = 0;
  std::vector<SpeedRun> speed;
};

// The whole report as JSON (what plot_report.py reads; field names are its contract).
nlohmann::json report_to_json(const ReportData& data);

}  // namespace kvlm
