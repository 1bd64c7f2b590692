// report.md and report.json from hand-made numbers, the named configurations, and the PNG plots.
#include <filesystem>
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

TEST(ReportJson, CarriesWhatThePlotScriptReads) {
  const nlohmann::json j = report_to_json(sample_report());
  EXPECT_EQ(j["memory"][1]["ratio_to_f16"].get<double>(), 1.0);
  EXPECT_EQ(j["quality"][0]["baseline"].get<bool>(), true);
  EXPECT_EQ(j["stream"][0]["segments"][2]["end"].get<int>(), 768);
  EXPECT_EQ(j["recall"][0]["distances"][1].get<int>(), 64);
  EXPECT_EQ(j["speed"][0]["tg_tokens_per_second"][0].get<double>(), 7000);
  EXPECT_EQ(j["stream_trained_ctx"].get<int>(), 512);
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
  const std::vector<std::string> expected{"memory_per_token.png", "quality.png", "stream_ppl.png", "recall.png",
                                          "decode_speed.png"};
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
