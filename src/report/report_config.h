// ReportConfig: the matrix of KV options and the instrument settings one `kvlm report` runs.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "report/report_data.h"

namespace kvlm {

struct ReportConfig {
  std::string name = "full";
  std::vector<ReportOption> options;  // every option runs through memory, quality, recall, speed
  std::vector<ReportOption> stream_options;  // the stream is O(tokens²) per option: fewer of them
  int block_size = 16;

  int ppl_ctx = 256;
  int ppl_max_windows = 0;  // 0 = every window of the text

  int stream_tokens = 20000;
  int stream_segment = 512;
  int trained_ctx = 0;  // 0 = the GGUF's context_length

  std::vector<int> recall_distances{0, 64, 128, 256, 512, 1024};
  int recall_trials = 8;
  int recall_span = 32;
  // Spans cut from the text rather than random tokens: tiny story models copy names and phrases,
  // not noise (stories260K scores chance on random spans even right after the first copy).
  bool recall_text_spans = true;

  // Token eviction (issue 5). Every policy runs with the f32 codec unless its option names another.
  std::vector<std::string> evict_policies{"window", "streaming", "h2o", "snapkv"};
  int evict_sinks = 4;          // streaming's attention sinks
  int snapkv_window_max = 32;   // snapkv's observation window: min(this, budget / 4), below the budget
  int evict_budget = 256;       // the stream runs (and memory rows): one stream per policy, stream_tokens long
  std::vector<double> evict_budget_fractions{0.125, 0.25, 0.5};  // quality: budgets as shares of ppl_ctx
  double composed_budget_fraction = 0.25;  // quality: policies combined with a quantized codec
  // KIVI's residual window in the composed row: a residual >= the budget would keep every token in
  // f32 and quantize nothing, so one block instead of the paper's 128.
  int composed_kivi_residual = 16;
  int recall_evict_budget = 128;           // recall: policies whose budget the distances cross
  std::vector<std::string> recall_evict_policies{"window", "streaming", "h2o"};
  std::vector<std::string> recall_evict_codecs{"f32", "int8", "int4"};  // full caches beside them
  std::vector<int> recall_evict_distances{0, 32, 64, 96, 128, 160, 192, 256};
  // The retrieval margin on stories260K is a few hundredths: more trials than the codec matrix.
  int recall_evict_trials = 32;
  // Attention on the first token, over queries [begin, end): the attention-sink check.
  std::vector<std::pair<int, int>> sink_probe_queries{{100, 150}, {300, 350}};

  int bench_prompt = 128;
  int bench_gen = 32;
  std::vector<int> bench_depths{0, 256, 1024};
  int bench_reps = 3;
};

// The options of this build worth comparing: every codec for K and V alike, plus mixed pairs
// that matter (int8 keys with int4 values), each only if the build has the codecs.
std::vector<ReportOption> default_report_options();

// "full": the committed report's settings; "quick": the same matrix, small enough for CI
// (seconds on stories260K). An error for any other name.
Result<ReportConfig> report_config_named(const std::string& name);

nlohmann::json report_config_to_json(const ReportConfig& config);

// The eviction options a configuration runs, built from its evict_* knobs (f32 codec unless named):
// one per policy at evict_budget (the streams);
std::vector<ReportOption> stream_policy_options(const ReportConfig& config);
// every policy at each budget fraction of ppl_ctx, then streaming + int8 and h2o + kivi4 at the
// composed fraction (each only if the build has the codec);
std::vector<ReportOption> quality_policy_options(const ReportConfig& config);
// the full cache with each recall codec, then each recall policy at recall_evict_budget.
std::vector<ReportOption> recall_policy_options(const ReportConfig& config);
// A policy at a budget on top of a codec option: "h2o b64 + kivi4 r16" (the codec is left out of
// the label when it is f32).
ReportOption make_policy_option(const ReportConfig& config, const std::string& policy, int budget,
                                const ReportOption& codec);

}  // namespace kvlm
