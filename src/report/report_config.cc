#include "report/report_config.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "kv/kv_storage.h"
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
    if (rotates_keys_by_default(type)) {
      // The same codec with its keys stored as they come: what the Hadamard rotation buys.
      ReportOption unrotated = *make_option(name, name);
      unrotated.unrotated = true;
      unrotated.label += " unrotated";
      options.push_back(unrotated);
    }
  }
  if (auto mixed = make_option("int8", "int4")) options.push_back(*mixed);
  return options;
}

ReportOption make_policy_option(const ReportConfig& config, const std::string& policy, int budget,
                                const ReportOption& codec) {
  ReportOption o = codec;
  o.policy = policy;
  o.budget = budget;
  if (policy == "streaming") o.sinks = config.evict_sinks;
  if (policy == "snapkv") o.snapkv_window = std::min(config.snapkv_window_max, budget / 4);
  o.label = fmt::format("{} b{}", policy, budget);
  if (codec.label != "f32") o.label += " + " + codec.label;
  return o;
}

std::vector<ReportOption> stream_policy_options(const ReportConfig& config) {
  std::vector<ReportOption> options;
  const ReportOption f32 = *make_option("f32", "f32");
  for (const std::string& policy : config.evict_policies) {
    options.push_back(make_policy_option(config, policy, config.evict_budget, f32));
  }
  return options;
}

std::vector<ReportOption> quality_policy_options(const ReportConfig& config) {
  std::vector<ReportOption> options;
  const ReportOption f32 = *make_option("f32", "f32");
  const auto budget_of = [&](double fraction) { return static_cast<int>(std::lround(fraction * config.ppl_ctx)); };
  for (const std::string& policy : config.evict_policies) {
    for (double fraction : config.evict_budget_fractions) {
      options.push_back(make_policy_option(config, policy, budget_of(fraction), f32));
    }
  }
  const int composed = budget_of(config.composed_budget_fraction);
  if (auto int8 = make_option("int8", "int8")) {
    options.push_back(make_policy_option(config, "streaming", composed, *int8));
  }
  if (auto kivi4 = make_option("kivi4", "kivi4", config.composed_kivi_residual)) {
    options.push_back(make_policy_option(config, "h2o", composed, *kivi4));
  }
  return options;
}

std::vector<ReportOption> recall_policy_options(const ReportConfig& config) {
  std::vector<ReportOption> options;
  for (const std::string& codec : config.recall_evict_codecs) {
    if (auto o = make_option(codec, codec)) options.push_back(*o);
  }
  const ReportOption f32 = *make_option("f32", "f32");
  for (const std::string& policy : config.recall_evict_policies) {
    options.push_back(make_policy_option(config, policy, config.recall_evict_budget, f32));
  }
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
    config.evict_budget_fractions = {0.125, 0.5};
    config.recall_evict_distances = {0, 64, 192};
    config.recall_evict_trials = 2;
    config.sink_probe_queries = {{100, 150}};
    return config;
  }
  return Status::errorf("report configuration '{}' is not one of: full, quick", name);
}

nlohmann::json report_config_to_json(const ReportConfig& c) {
  nlohmann::json options = nlohmann::json::array();
  for (const ReportOption& o : c.options) options.push_back(o.label);
  nlohmann::json stream_options = nlohmann::json::array();
  for (const ReportOption& o : c.stream_options) stream_options.push_back(o.label);
  nlohmann::json sink_queries = nlohmann::json::array();
  for (const auto& [begin, end] : c.sink_probe_queries) sink_queries.push_back({begin, end});
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
      {"evict_policies", c.evict_policies},
      {"evict_sinks", c.evict_sinks},
      {"snapkv_window_max", c.snapkv_window_max},
      {"evict_budget", c.evict_budget},
      {"evict_budget_fractions", c.evict_budget_fractions},
      {"composed_budget_fraction", c.composed_budget_fraction},
      {"composed_kivi_residual", c.composed_kivi_residual},
      {"recall_evict_budget", c.recall_evict_budget},
      {"recall_evict_policies", c.recall_evict_policies},
      {"recall_evict_codecs", c.recall_evict_codecs},
      {"recall_evict_distances", c.recall_evict_distances},
      {"recall_evict_trials", c.recall_evict_trials},
      {"sink_probe_queries", sink_queries},
  };
}

}  // namespace kvlm
