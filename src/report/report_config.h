// ReportConfig: the matrix of KV options and the instrument settings one `kvlm report` runs.
#pragma once

#include <string>
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

}  // namespace kvlm
