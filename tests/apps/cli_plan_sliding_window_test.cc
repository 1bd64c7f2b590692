// `kvlm plan` with local (sliding-window) layers: Gemma 3 presets, --sliding-window and
// --local-layers-period on an explicit shape, the figures at the context, memory fit, errors.
#include <algorithm>
#include <cstdint>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/subprocess.h"

namespace kvlm {
namespace {

using testing::kvlm_binary;
using testing::run_command;

nlohmann::json plan_json(const std::string& args) {
  const auto r = run_command(kvlm_binary() + " plan " + args + " --json");
  EXPECT_EQ(r.exit_code, 0) << args << ": " << r.err;
  return r.exit_code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
}

const nlohmann::json* row(const nlohmann::json& j, const std::string& label) {
  for (const auto& r : j["rows"]) {
    if (r["label"] == label) return &r;
  }
  return nullptr;
}

// gemma-3-4b: 34 layers, globals 5, 11, 17, 23, 29; 4 kv heads × (256 + 256) × 2 B = 4096 B per
// layer and token in f16; window 1024.
TEST(CliPlanSlidingWindow, Gemma4bJsonAtTheTrainedContext) {
  const auto j = plan_json("--preset gemma-3-4b");
  ASSERT_TRUE(j.contains("local_layers")) << j.dump();
  EXPECT_EQ(j["ctx"].get<int64_t>(), 131072);
  EXPECT_EQ(j["step_tokens"].get<int64_t>(), 1);
  EXPECT_EQ(j["model"]["sliding_window"].get<int>(), 1024);
  EXPECT_EQ(j["model"]["num_local_layers"].get<int>(), 29);
  EXPECT_EQ(j["model"]["global_layers"], nlohmann::json({5, 11, 17, 23, 29}));
  const auto& local = j["local_layers"];
  EXPECT_EQ(local["window"].get<int>(), 1024);
  EXPECT_EQ(local["num_global_layers"].get<int>(), 5);
  EXPECT_EQ(local["max_blocks_per_local_layer"].get<int64_t>(), 1024 / 16 + 1);
  const double kept = (5.0 * 131072 + 29.0 * 1024) / (34.0 * 131072);
  EXPECT_DOUBLE_EQ(local["kept_fraction_at_ctx"].get<double>(), kept);
  // 1 - (5 × 131,072 + 29 × 1,024) / (34 × 131,072) = 1 - 685,056 / 4,456,448 = 84.6%
  EXPECT_EQ(local["summary"], "local layers: 29 of 34 at window 1024: 85% of the full cache saved at 131,072 tokens");

  const auto* f16 = row(j, "f16");
  ASSERT_NE(f16, nullptr);
  EXPECT_EQ((*f16)["bytes_per_token"].get<double>(), 34.0 * 4096);
  EXPECT_EQ((*f16)["total_bytes_formula"].get<double>(), 4096.0 * (5 * 131072 + 29 * 1024));
  EXPECT_DOUBLE_EQ((*f16)["bytes_per_token_at_ctx"].get<double>(), 4096.0 * (5 * 131072 + 29 * 1024) / 131072);
  EXPECT_EQ((*f16)["blocks_per_sequence"].get<int64_t>(), 8192);
  EXPECT_EQ((*f16)["local_blocks_per_sequence"].get<int64_t>(), 65);
  EXPECT_EQ((*f16)["total_bytes_blocks"].get<uint64_t>(), (5ull * 8192 + 29ull * 65) * 16 * 4096);
  EXPECT_DOUBLE_EQ((*f16)["ratio_to_baseline"].get<double>(), 0.5);  // 4 of 8 heads
  EXPECT_DOUBLE_EQ((*f16)["ratio_at_ctx"].get<double>(), 0.5 * kept);
  EXPECT_TRUE(j["warnings"].empty());
}

TEST(CliPlanSlidingWindow, HumanTableShowsBothFiguresAndTheSaving) {
  const auto r = run_command(kvlm_binary() + " plan --preset gemma-3-1b");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("local layers: 22 of 26 at window 512: 83% of the full cache saved at 32,768 tokens "
                       "(global layers: 5, 11, 17, 23)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("at most 33 blocks (steps of 1 token)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("at ctx"), std::string::npos) << r.out;
  // f16: 26 KiB per token for the full cache; 1 KiB × (4 × 32768 + 22 × 512) / 32768 = 4.34 KiB at 32,768.
  EXPECT_NE(r.out.find("26.00 KiB"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("4.34 KiB"), std::string::npos) << r.out;
  // A model without local layers keeps its table as it was.
  const auto l = run_command(kvlm_binary() + " plan --preset llama-3-8b");
  ASSERT_EQ(l.exit_code, 0) << l.err;
  EXPECT_EQ(l.out.find("at ctx"), std::string::npos) << l.out;
  EXPECT_EQ(l.out.find("local layers"), std::string::npos) << l.out;
}

// 12 layers, 4 kv heads × (64 + 64) × 2 B = 1024 B per layer and token in f16.
TEST(CliPlanSlidingWindow, ExplicitShapeFlags) {
  const std::string shape = "--layers 12 --heads 8 --kv-heads 4 --head-dim 64 --ctx 4096";
  const auto six = plan_json(shape + " --sliding-window 256");
  EXPECT_EQ(six["model"]["global_layers"], nlohmann::json({5, 11}));  // period 6 by default
  EXPECT_EQ((*row(six, "f16"))["total_bytes_formula"].get<double>(), 1024.0 * (2 * 4096 + 10 * 256));
  const auto four = plan_json(shape + " --sliding-window 256 --local-layers-period 4");
  EXPECT_EQ(four["model"]["global_layers"], nlohmann::json({3, 7, 11}));
  EXPECT_EQ((*row(four, "f16"))["total_bytes_formula"].get<double>(), 1024.0 * (3 * 4096 + 9 * 256));
  // Every layer local (Mistral 7B v0.1's layout): flat past the window.
  const auto all = plan_json(shape + " --sliding-window 256 --local-layers-period 13");
  EXPECT_EQ(all["model"]["num_local_layers"].get<int>(), 12);
  EXPECT_EQ((*row(all, "f16"))["total_bytes_formula"].get<double>(), 1024.0 * 12 * 256);
  // A longer step holds more blocks in each local layer: ceil((256 + 511) / 16) + 1.
  const auto step = plan_json(shape + " --sliding-window 256 --step-tokens 512");
  EXPECT_EQ((*row(step, "f16"))["local_blocks_per_sequence"].get<int64_t>(), 49);
  const auto none = plan_json(shape);
  EXPECT_EQ(none["model"]["num_local_layers"].get<int>(), 0);
  EXPECT_FALSE(none.contains("local_layers"));
}

// 1 GiB for f16 gemma-3-1b's shape (no parameter count: no weights): 65,536 one-layer blocks of
// 16 KiB. Every layer global: 65,536 / 26 = 2,520 blocks; with the window, g blocks per global
// layer cost 4g + 22·min(g, 33).
TEST(CliPlanSlidingWindow, MemoryFitCountsTheWindow) {
  const std::string args = " --layers 26 --heads 4 --kv-heads 1 --head-dim 256 --ctx 32768 --memory 1GiB";
  const auto windowed = plan_json(args + " --sliding-window 512");
  const auto full = plan_json(args);
  EXPECT_EQ(windowed["weight_bytes"].get<uint64_t>(), 0u);
  int64_t g = 0;
  while (4 * (g + 1) + 22 * std::min<int64_t>(g + 1, 33) <= 65536) ++g;
  const auto* w16 = row(windowed, "f16");
  const auto* f16 = row(full, "f16");
  ASSERT_NE(w16, nullptr);
  ASSERT_NE(f16, nullptr);
  EXPECT_EQ((*w16)["fit"]["tokens"].get<int64_t>(), g * 16);
  EXPECT_EQ((*f16)["fit"]["tokens"].get<int64_t>(), 65536 / 26 * 16);
  EXPECT_EQ((*w16)["fit"]["sequences"].get<int64_t>(), (int64_t{1} << 30) / ((4 * 2048 + 22 * 33) * 16384));
  EXPECT_EQ((*f16)["fit"]["sequences"].get<int64_t>(), (int64_t{1} << 30) / (26 * 2048 * 16384));
}

TEST(CliPlanSlidingWindow, AdviseReportsTheFigureAtTheContext) {
  const auto j = plan_json("--preset gemma-3-12b --ctx 131072 --memory 48GiB --advise long-recall");
  ASSERT_FALSE(j["advice"]["chosen"].is_null());
  const std::string reasons = j["advice"]["reasons"].dump();
  EXPECT_NE(reasons.find("/token at 131072 tokens"), std::string::npos) << reasons;
  EXPECT_NE(reasons.find("40 of 48 layers are local"), std::string::npos) << reasons;
}

TEST(CliPlanSlidingWindow, BadFlagCombinationsAreErrors) {
  struct Case {
    std::string args;
    std::string says;
  };
  const std::string shape = "--layers 12 --heads 8 --head-dim 64";
  const Case cases[] = {
      {shape + " --local-layers-period 4", "--local-layers-period needs --sliding-window"},
      {shape + " --sliding-window 0", "--sliding-window 0 must be >= 1"},
      {shape + " --sliding-window 64 --local-layers-period 1", "--local-layers-period 1 must be in [2, 13]"},
      {shape + " --sliding-window 64 --local-layers-period 14", "--local-layers-period 14 must be in [2, 13]"},
      {"--preset gemma-3-1b --sliding-window 64", "describe an explicit shape"},
      {"--preset llama-3-8b --local-layers-period 6", "describe an explicit shape"},
      {"--preset llama-3-8b --step-tokens 64", "--step-tokens changes only local"},
      {"--preset gemma-3-1b --step-tokens 0", "step tokens 0 must be in [1, 2^31]"},
  };
  for (const Case& c : cases) {
    const auto r = run_command(kvlm_binary() + " plan " + c.args);
    EXPECT_EQ(r.exit_code, 1) << c.args << ": " << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << c.args << ": " << r.err;
  }
}

}  // namespace
}  // namespace kvlm
