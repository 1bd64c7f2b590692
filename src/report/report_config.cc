#include "report/report_config.h"

#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "kv/kv_type.h"

namespace kvlm {
namespace {

constexpr int kKiviPaperResidual = 128;

std::optional<ReportOption> make_option(std::string_view k_name, std::string_view v_name, int kivi_residual = 0) {
  const auto k = parse_kv_type(k_name);
  const auto v = parse_kv_type(v_name);
  if (!k || !v) return std::nullopt;
  ReportOption o;
  o.k_type = std::string(kv_type_name(*k));
  o.v_type = std::string(kv_type_name(*v));
  o.label = o.k_type == o.v_type ? o.k_type : o.k_type + "/" + o.v_type;
  if (is_kivi(*k) || is_kivi(*v)) {
    o.kivi_residual = kivi_residual;
    o.label += fmt::format(" r{}", kivi_residual);
  }
  return o;
}

}  // namespace

std::vector<ReportOption> default_report_options() {
  std::vector<ReportOption> options;
  for (KvType type : all_kv_types()) {
    const std::string_view name = kv_type_name(type);
    if (is_kivi(type)) {
      // KIVI with its paper's residual window of 128 tokens, and with none: what the window buys.
      options.push_back(*make_option(name, name, kKiviPaperResidual));
      options.push_back(*make_option(name, name, 0));
    } else {
      options.push_back(*make_option(name, name));
    }
  }
  if (auto mixed = make_option("int8", "int4")) options.push_back(*mixed);
  return options;
}

Result<ReportConfig> report_config_named(const std::string& name) {
  ReportConfig config;
  config.name = name;
  config.options = default_report_options();
  config.stream_options = {*make_option("f32", "f32")};
  if (auto f16 = make_option("f16", "f16")) config.stream_options.push_back(*f16);
  if (name == "full") return config;
  if (name == "quick") {
    config.ppl_max_windows = 8;
    config.stream_tokens = 1536;
    config.stream_segment = 256;
    config.recall_distances = {0, 64, 256};
    config.recall_trials = 2;
    config.recall_span = 16;
    config.bench_prompt = 32;
    config.bench_gen = 8;
    config.bench_depths = {0, 128};
    config.bench_reps = 2;
    return config;
  }
  return Status::errorf("report configuration '{}' is not one of: full, quick", name);
}

nlohmann::json report_config_to_json(const ReportConfig& c) {
  nlohmann::json options = nlohmann::json::array();
  for (const ReportOption& o : c.options) options.push_back(o.label);
  nlohmann::json stream_options = nlohmann::json::array();
  for (const ReportOption& o : c.stream_options) stream_options.push_back(o.label);
  return {
      {"name", c.name},
      {"options", options},
      {"stream_options", stream_options},
      {"block_size", c.block_size},
      {"ppl_ctx", c.ppl_ctx},
      {"ppl_max_windows", c.ppl_max_windows},
      {"stream_tokens", c.stream_tokens},
      {"stream_segment", c.stream_segment},
      {"trained_ctx", c.trained_ctx},
      {"recall_distances", c.recall_distances},
      {"recall_trials", c.recall_trials},
      {"recall_span", c.recall_span},
      {"recall_spans", c.recall_text_spans ? "text" : "random"},
      {"bench_prompt", c.bench_prompt},
      {"bench_gen", c.bench_gen},
      {"bench_depths", c.bench_depths},
      {"bench_reps", c.bench_reps},
  };
}

}  // namespace kvlm
