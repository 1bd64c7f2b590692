// report.md and report.json from hand-made numbers, the named configurations, and the PNG plots.
#include <filesystem>
#include <algorithm>
#include <fstream>

#include <gtest/gtest.h>

#include "report/report_config.h"
#include "report/report_data.h"
#include "report/report_markdown.h"
#include "report/report_plots.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

ReportData sample_report() {
  ReportData d;
  d.model = {"m.gguf", "llama", 5, 8, 4, 8, 512, 512};
  d.text_name = "t.txt";
  d.text_tokens = 1234567;
  d.config_name = "quick";
  d.config = {{"ppl_ctx", 256}};
  d.machine = "2 threads";
  d.date = "2026-11-29 12:00 UTC";
  const ReportOption f32{"f32", "f32", "f32"}, f16{"f16", "f16", "f16"};
  d.memory = {{f32, 1280, 1280, 2.0}, {f16, 640, 640, 1.0}};
  d.quality_ctx = 256;
  QualityRow base;
  base.option = f32;
  base.baseline = true;
  base.ppl = 3.9392;
  base.tokens_scored = 1016;
  QualityRow half;
  half.option = f16;
  half.ppl = 3.94;
  half.delta_ppl_pct = 0.02;
  half.mean_kld = 1.5e-6;
  half.top1_agreement = 0.9995;
  half.tokens_scored = 1016;
  d.quality = {base, half};
  d.stream_trained_ctx = 512;
  d.stream_segment = 256;
  d.stream = {{f32, 4.5, {{0, 256, 4.0, 327680}, {256, 512, 4.2, 655360}, {512, 768, 9.5, 983040}}}};
  d.recall_span = 16;
  d.recall_trials = 2;
  RecallRun recall;
  recall.option = f32;
  recall.distances = {0, 64};
  recall.prompt_tokens = {33, 600};  // the second one is past the trained context of 512
  recall.accuracy = {0.9, 0.5};
  recall.accuracy_stderr = {0.01, 0.05};
  recall.control = {0.1, 0.1};
  recall.chance = 1.0 / 512;
  d.recall = {recall};

  // Token eviction: full cache against two policies at a budget of 256.
  ReportOption window{"window b256", "f32", "f32"};
  window.policy = "window";
  window.budget = 256;
  ReportOption streaming = window;
  streaming.label = "streaming b256";
  streaming.policy = "streaming";
  streaming.sinks = 4;
  ReportOption full_cache{"full", "f32", "f32"};
  d.evict_stream_budget = 256;
  StreamRun full_run{full_cache, 50.0, {{0, 256, 4.0, 327680}, {256, 512, 4.2, 655360}, {512, 768, 9.5, 983040}}};
  full_run.in_context_ppl = 4.1;
  full_run.past_context_ppl = 9.5;
  full_run.kv_bytes_peak = 983040;
  StreamRun window_run{window, 4.2, {{0, 256, 4.0, 327680}, {256, 512, 4.3, 348160}, {512, 768, 4.4, 348160}}};
  window_run.in_context_ppl = 4.15;
  window_run.past_context_ppl = 4.4;
  window_run.kv_bytes_peak = 348160;
  StreamRun streaming_run = window_run;
  streaming_run.option = streaming;
  streaming_run.segments[2].ppl = 4.422;  // 0.5% above the window
  d.stream_policies = {full_run, window_run, streaming_run};
  d.eviction_memory = {{full_cache, 768, 983040, 983040, 983040}, {window, 768, 327680, 348160, 983040}};
  d.sink_probe = {{100, 150, 0.003, 0.008}};
  QualityRow evicted = half;
  evicted.option = window;
  evicted.option.label = "window b32";
  evicted.option.budget = 32;
  evicted.delta_ppl_pct = 12.5;
  evicted.mean_kld = 0.25;
  QualityRow snap = evicted;
  snap.option.label = "snapkv b32";
  snap.option.policy = "snapkv";
  snap.option.snapkv_window = 8;
  snap.delta_ppl_pct = 3.25;
  d.quality_policies = {evicted, snap};
  d.recall_policies_trials = 4;
  RecallRun kept = recall;
  kept.option = f32;
  kept.distances = {0, 128};
  kept.prompt_tokens = {33, 161};
  kept.accuracy = {0.9, 0.6};
  kept.accuracy_stderr = {0.01, 0.02};
  kept.control = {0.4, 0.4};
  RecallRun dropped = kept;
  dropped.option = window;
  dropped.option.label = "window b128";
  dropped.option.budget = 128;
  dropped.accuracy = {0.9, 0.41};
  d.recall_policies = {kept, dropped};

  d.speed_threads = 2;
  d.speed_reps = 2;
  d.speed_gen_tokens = 8;
  d.speed = {{f16, {0, 128}, {7000, 6500}, {10, 20}, {1.5, 1.6}, {9000, 8000}}};
  return d;
}

TEST(ReportMarkdown, HasEveryTableRowAndOnlyThePlotsThatExist) {
  const std::string md = render_report_markdown(sample_report(), {"quality.png"}, "kvlm report ...");
  EXPECT_NE(md.find("# kvlm KV-cache report: m.gguf"), std::string::npos);
  EXPECT_NE(md.find("| f16 | f16 | 640 | 640 | 1.000× |"), std::string::npos) << md;
  EXPECT_NE(md.find("| f32 (baseline) | 3.9392"), std::string::npos) << md;
  EXPECT_NE(md.find("| f16 | 3.9400 ± 0.0000 | +0.0200% | 1.5e-06"), std::string::npos) << md;
  EXPECT_NE(md.find("| 512–768 † | 9.500 |"), std::string::npos) << md;  // past the trained context
  EXPECT_NE(md.find("| 256–512 | 4.200 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 0 | 0.900 ± 0.010 | 0.100 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 64 † | 0.500 ± 0.050 | 0.100 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| f16 | 128 | 6500.0 ± 20.0 | 1.60 | 8000.0 |"), std::string::npos) << md;
  EXPECT_NE(md.find("1,234,567 tokens"), std::string::npos) << md;
  EXPECT_NE(md.find("![Delta perplexity and mean KLD per option](quality.png)"), std::string::npos);
  EXPECT_EQ(md.find("memory_per_token.png"), std::string::npos);
}

TEST(ReportMarkdown, EvictionSectionsHaveTablesAndStatementsDerivedFromTheNumbers) {
  const std::string md = render_report_markdown(
      sample_report(), {"stream_ppl_policies.png", "quality_vs_budget.png", "recall_policies.png"}, "kvlm report ...");
  // Memory: the planner's bound beside the measured peak.
  EXPECT_NE(md.find("### Bytes held under token eviction"), std::string::npos) << md;
  EXPECT_NE(md.find("| window b256 | 256 | 327,680 | 348,160 | 1.062 | 0.3542× |"), std::string::npos) << md;
  EXPECT_NE(md.find("| full | – | 983,040 | 983,040 | 1.000 | 1.0000× |"), std::string::npos) << md;
  // Stream: one column per policy, the summary rows, and what the numbers say.
  EXPECT_NE(md.find("## Stream perplexity under token eviction"), std::string::npos) << md;
  EXPECT_NE(md.find("| tokens | full | window b256 | streaming b256 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 512–768 † | 9.500 | 4.400 | 4.422 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| in-context PPL | 4.100 | 4.150 | 4.150 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| peak KV bytes | 983,040 | 348,160 | 348,160 |"), std::string::npos) << md;
  EXPECT_NE(md.find("first exceeds twice its in-context value (4.100) in segment 512–768 (9.500)"), std::string::npos)
      << md;
  EXPECT_NE(md.find("bytes held at segment ends 348,160–348,160 (0.0% spread)"), std::string::npos) << md;
  EXPECT_NE(md.find("- window b256: past-context perplexity +6.0% against in-context"), std::string::npos) << md;
  EXPECT_NE(md.find("differ by at most 0.50% in any segment (largest at 512)"), std::string::npos) << md;
  EXPECT_NE(md.find("| 100–150 | 0.300% | 0.800% | 0.38 |"), std::string::npos) << md;
  EXPECT_NE(md.find("less than a uniform share at every probed depth (at most 0.38×"), std::string::npos) << md;
  EXPECT_NE(md.find("](stream_ppl_policies.png)"), std::string::npos);
  // Quality against the budget, with SnapKV's "compress, then answer" reading spelled out.
  EXPECT_NE(md.find("### Quality under token eviction"), std::string::npos) << md;
  EXPECT_NE(md.find("| window b32 | window | 32 | 12.5% | 3.9400 ± 0.0000 | +12.500% | 0.25 |"), std::string::npos)
      << md;
  EXPECT_NE(md.find("compress the context, then answer"), std::string::npos) << md;
  EXPECT_NE(md.find("- Budget 32 (12.5% of the window): decoding under the budget, least costly window (+12.50%, "
                    "KLD 0.25), most costly window (+12.50%, KLD 0.25); SnapKV (compress, then answer) +3.25% "
                    "(KLD 0.25)."),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("](quality_vs_budget.png)"), std::string::npos);
  // Recall: kept details against evicted ones, and where each reaches the control.
  EXPECT_NE(md.find("## Recall: details quantized against details evicted"), std::string::npos) << md;
  EXPECT_NE(md.find("a window of 128 loses the first copy for distances above 112"), std::string::npos) << md;
  EXPECT_NE(md.find("| 128 | 0.600 ± 0.020 | 0.410 ± 0.020 | 0.400 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| f32 | +0.500 | +0.200 | none |"), std::string::npos) << md;
  EXPECT_NE(md.find("| window b128 | +0.500 | +0.010 | 128 |"), std::string::npos) << md;
  EXPECT_NE(md.find("The f32 cache's own margin is +0.500 up to distance 112 and +0.200 past it, against a standard "
                    "error of about 0.015 per point: the model still retrieves past the budget"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("](recall_policies.png)"), std::string::npos);
}

TEST(ReportMarkdown, WithoutEvictionDataTheEvictionSectionsAreLeftOut) {
  ReportData d = sample_report();
  d.stream_policies.clear();
  d.eviction_memory.clear();
  d.sink_probe.clear();
  d.quality_policies.clear();
  d.recall_policies.clear();
  const std::string md = render_report_markdown(d, {}, "kvlm report ...");
  EXPECT_EQ(md.find("token eviction"), std::string::npos) << md;
  EXPECT_EQ(md.find("details evicted"), std::string::npos) << md;
  EXPECT_NE(md.find("## Stream perplexity over length"), std::string::npos);
}

TEST(ReportJson, CarriesWhatThePlotScriptReads) {
  const nlohmann::json j = report_to_json(sample_report());
  EXPECT_EQ(j["memory"][1]["ratio_to_f16"].get<double>(), 1.0);
  EXPECT_EQ(j["quality"][0]["baseline"].get<bool>(), true);
  EXPECT_EQ(j["stream"][0]["segments"][2]["end"].get<int>(), 768);
  EXPECT_EQ(j["recall"][0]["distances"][1].get<int>(), 64);
  EXPECT_EQ(j["speed"][0]["tg_tokens_per_second"][0].get<double>(), 7000);
  EXPECT_EQ(j["stream_trained_ctx"].get<int>(), 512);
  // Eviction: the policy and budget beside every option, and the new sections.
  EXPECT_EQ(j["quality"][0]["policy"], "none");
  EXPECT_EQ(j["stream_policies"][1]["policy"], "window");
  EXPECT_EQ(j["stream_policies"][2]["sinks"].get<int>(), 4);
  EXPECT_EQ(j["stream_policies"][1]["kv_bytes_peak"].get<uint64_t>(), 348160u);
  EXPECT_EQ(j["stream_policies"][0]["past_context_ppl"].get<double>(), 9.5);
  EXPECT_EQ(j["evict_stream_budget"].get<int>(), 256);
  EXPECT_EQ(j["eviction_memory"][1]["planned_bytes"].get<uint64_t>(), 327680u);
  EXPECT_EQ(j["sink_probe"][0]["first_token_share"].get<double>(), 0.003);
  EXPECT_EQ(j["quality_policies"][1]["snapkv_window"].get<int>(), 8);
  EXPECT_EQ(j["quality_policies"][0]["budget"].get<int>(), 32);
  EXPECT_EQ(j["recall_policies"][1]["budget"].get<int>(), 128);
  EXPECT_EQ(j["recall_policies"][1]["control"][1].get<double>(), 0.4);
}

TEST(ReportConfig, NamedConfigurations) {
  auto full = report_config_named("full");
  ASSERT_TRUE(full.ok());
  auto quick = report_config_named("quick");
  ASSERT_TRUE(quick.ok());
  EXPECT_LT(quick->stream_tokens, full->stream_tokens);
  EXPECT_EQ(quick->options.size(), full->options.size());  // the same matrix, smaller sizes
  ASSERT_GE(full->options.size(), 2u);
  EXPECT_EQ(full->options[0].label, "f32");
  EXPECT_EQ(full->options[1].label, "f16");
  // Eviction: every policy in the streams, budgets as fractions of the PPL window, valid SnapKV
  // windows, composed rows at a quarter of the window, and recall budgets the distances cross.
  const auto streams = stream_policy_options(*full);
  ASSERT_EQ(streams.size(), 4u);
  EXPECT_EQ(streams[0].label, "window b256");
  EXPECT_EQ(streams[1].sinks, 4);
  EXPECT_EQ(streams[3].snapkv_window, 32);
  const auto quality = quality_policy_options(*full);
  ASSERT_GE(quality.size(), 12u);
  EXPECT_EQ(quality[0].budget, 32);
  EXPECT_EQ(quality[1].budget, 64);
  EXPECT_EQ(quality[2].budget, 128);
  for (const ReportOption& o : quality) {
    if (o.policy == "snapkv") {
      EXPECT_EQ(o.snapkv_window, std::min(32, o.budget / 4)) << o.label;
    }
    if (o.k_type != "f32") {
      EXPECT_EQ(o.budget, 64) << o.label;
      EXPECT_LT(o.kivi_residual, o.budget) << o.label;
    }
  }
  EXPECT_EQ(quality[12].label, "streaming b64 + int8");
  EXPECT_LT(quality_policy_options(*quick).size(), quality.size());
  const auto recall = recall_policy_options(*full);
  ASSERT_EQ(recall.size(), 6u);
  EXPECT_EQ(recall[1].label, "int8");
  EXPECT_EQ(recall[3].label, "window b128");
  EXPECT_GT(full->recall_evict_distances.back(), full->recall_evict_budget);
  EXPECT_GT(quick->recall_evict_distances.back(), quick->recall_evict_budget);
  const auto json = report_config_to_json(*full);
  EXPECT_EQ(json["evict_budget"].get<int>(), 256);
  EXPECT_EQ(json["evict_budget_fractions"].size(), 3u);
  auto bad = report_config_named("huge");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("full, quick"), std::string::npos);
}

TEST(ReportPlots, DrawsOnePngPerSection) {
  const auto dir = testing::scratch_dir("report_plots");
  const auto json_path = dir / "report.json";
  std::ofstream(json_path) << report_to_json(sample_report()).dump();
  auto written = draw_report_plots(json_path.string(), dir.string());
  ASSERT_TRUE(written.ok()) << written.status().message();
  const std::vector<std::string> expected{"memory_per_token.png", "quality.png",       "quality_vs_budget.png",
                                          "stream_ppl.png",       "stream_ppl_policies.png", "recall.png",
                                          "recall_policies.png",  "decode_speed.png"};
  EXPECT_EQ(*written, expected);
  for (const std::string& name : expected) {
    const auto path = dir / name;
    ASSERT_TRUE(std::filesystem::exists(path)) << name;
    const auto bytes = testing::read_bytes(path);
    ASSERT_GT(bytes.size(), 1000u) << name;
    EXPECT_EQ(bytes[1], 'P');  // PNG signature: \x89 P N G
    EXPECT_EQ(bytes[2], 'N');
  }
}

TEST(ReportPlots, AFailingInterpreterIsAClearError) {
  const auto dir = testing::scratch_dir("report_plots_missing");
  ::setenv("KVLM_PYTHON", "/nonexistent/python3", 1);
  auto written = draw_report_plots((dir / "report.json").string(), dir.string());
  ::unsetenv("KVLM_PYTHON");
  ASSERT_FALSE(written.ok());
  EXPECT_NE(written.status().message().find("/nonexistent/python3"), std::string::npos);
}

}  // namespace
}  // namespace kvlm
