// Runs a report's matrix of KV options through the instruments (planner, perplexity + KLD,
// stream perplexity, recall probe, speed bench), the token-eviction policies through the
// quality, stream and recall instruments, and collects the numbers.
#pragma once

#include <functional>
#include <span>
#include <string>

#include "core/ids.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "report/report_config.h"
#include "report/report_data.h"

namespace kvlm {

class LlamaModel;

// One line of progress ("quality: int8 ..."), for the CLI to print on stderr.
using ReportProgressFn = std::function<void(const std::string& line)>;

// `text_tokens`: the whole evaluation text, tokenized once (BOS first when the model adds it).
// Fills every section of ReportData except the fields that describe the run's surroundings
// (date, machine, command), which the caller knows.
Result<ReportData> run_report(LlamaModel& model, ThreadPool& pool, std::span<const TokenId> text_tokens,
                              const ReportConfig& config, const ReportProgressFn& progress = {});

}  // namespace kvlm
