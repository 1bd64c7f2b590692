// `kvlm report` end to end on stories260K in the quick configuration (what CI runs), and the
// planner's prediction beside the live pool in `kvlm run`.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kv/kv_type.h"
#include "support/subprocess.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

using testing::kvlm_binary;
using testing::run_command;

std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(CliReport, QuickReportOnStories260KWritesEverySection) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  KVLM_REQUIRE_SHARED(text, "tinystories_valid_head.txt");
  const auto out = testing::scratch_dir("cli_report_quick") / "report";
  const auto r = run_command(kvlm_binary() + " report --model " + model.string() + " --text " + text.string() +
                             " --config quick --trained-ctx 512 --threads 2 --out " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The PNGs need python3-matplotlib, which CI has; without it the run fails with a clear error.
  for (const char* png : {"memory_per_token.png", "quality.png", "quality_vs_budget.png", "stream_ppl.png",
                          "stream_ppl_policies.png", "recall.png", "recall_policies.png", "decode_speed.png"}) {
    EXPECT_TRUE(std::filesystem::exists(out / png)) << png;
  }
  const std::string md = slurp(out / "report.md");
  for (const char* section :
       {"## Memory per token", "### Bytes held under token eviction", "## Quality", "### Quality under token eviction",
        "## Stream perplexity over length", "## Stream perplexity under token eviction",
        "## Recall against distance", "## Recall: details quantized against details evicted",
        "## Decode speed against depth", "](quality.png)", "](stream_ppl_policies.png)", "](quality_vs_budget.png)",
        "](recall_policies.png)"}) {
    EXPECT_NE(md.find(section), std::string::npos) << section;
  }
  const auto j = nlohmann::json::parse(slurp(out / "report.json"));
  const size_t num_options = j["config"]["options"].size();
  EXPECT_GE(num_options, all_kv_types().size());
  ASSERT_EQ(j["memory"].size(), num_options);
  for (const auto& row : j["memory"]) {
    EXPECT_EQ(row["bytes_per_token"], row["live_bytes_per_token"]) << row["option"];
  }
  // One quality row per option (f32 is the baseline row itself).
  ASSERT_EQ(j["quality"].size(), num_options);
  EXPECT_TRUE(j["quality"][0]["baseline"].get<bool>());
  const double base_ppl = j["quality"][0]["ppl"].get<double>();
  EXPECT_GT(base_ppl, 2.0);
  EXPECT_LT(base_ppl, 6.0);
  for (const auto& row : j["quality"]) {
    if (row["option"] == "f16") {
      EXPECT_LT(row["mean_kld"].get<double>(), 1e-4);
      EXPECT_GT(row["top1_agreement"].get<double>(), 0.99);
    }
  }
  ASSERT_EQ(j["stream"].size(), 2u);
  EXPECT_EQ(j["stream"][0]["segments"].size(), 6u);  // 1535 predictions in segments of 256
  ASSERT_EQ(j["recall"].size(), num_options);
  EXPECT_EQ(j["recall"][0]["distances"].size(), 3u);
  // Eviction: the full cache and one stream per policy, memory bounded by the budget (SnapKV:
  // plus the chunk it runs whole before compressing), quality rows at both quick budgets.
  const auto& policies = j["stream_policies"];
  ASSERT_EQ(policies.size(), 5u);
  EXPECT_EQ(policies[0]["policy"], "none");
  const double bytes_per_token = j["memory"][0]["bytes_per_token"].get<double>();  // f32
  const int budget = j["evict_stream_budget"].get<int>();
  for (size_t i = 1; i < policies.size(); ++i) {
    SCOPED_TRACE(policies[i]["option"].get<std::string>());
    const auto peak = policies[i]["kv_bytes_peak"].get<double>();
    EXPECT_LT(peak, policies[0]["kv_bytes_peak"].get<double>());
    EXPECT_GE(peak, budget * bytes_per_token);
    EXPECT_LE(peak, (budget + 256 + 2 * 16) * bytes_per_token);  // budget + a chunk + two blocks
    // The segments past the budget hold the same bytes, give or take the evicted blocks.
    const auto& segments = policies[i]["segments"];
    ASSERT_EQ(segments.size(), 6u);
    if (policies[i]["policy"] != "snapkv") {
      for (size_t s = 2; s < segments.size(); ++s) {
        EXPECT_NEAR(segments[s]["kv_bytes"].get<double>(), segments[1]["kv_bytes"].get<double>(),
                    2 * 16 * bytes_per_token);
      }
    }
    EXPECT_GT(policies[i]["overall_ppl"].get<double>(), 2.0);
  }
  ASSERT_EQ(j["eviction_memory"].size(), 5u);
  ASSERT_EQ(j["quality_policies"].size(), 4u * 2 + 2);
  for (const auto& row : j["quality_policies"]) {
    SCOPED_TRACE(row["option"].get<std::string>());
    // Dropping tokens changes the distributions, except SnapKV at half the window: its prompt
    // (the unscored half) fits the budget, so nothing is compressed.
    if (row["policy"] == "snapkv" && row["budget"].get<int>() >= j["quality_ctx"].get<int>() / 2) {
      EXPECT_LT(row["mean_kld"].get<double>(), 1e-9);
    } else {
      EXPECT_GT(row["mean_kld"].get<double>(), 1e-4);
    }
    EXPECT_EQ(row["tokens_scored"], j["quality"][0]["tokens_scored"]);
  }
  ASSERT_EQ(j["sink_probe"].size(), 1u);
  EXPECT_GT(j["sink_probe"][0]["uniform_share"].get<double>(), 0.0);
  ASSERT_EQ(j["recall_policies"].size(), 6u);
  EXPECT_EQ(j["recall_policies"][0]["distances"].size(), 3u);
  ASSERT_EQ(j["speed"].size(), num_options);
  for (const auto& run : j["speed"]) {
    for (const auto& tps : run["tg_tokens_per_second"]) EXPECT_GT(tps.get<double>(), 0.0);
  }
}

TEST(CliReport, BadConfigurationAndFolderAreOneLineErrors) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  KVLM_REQUIRE_SHARED(text, "tinystories_valid_head.txt");
  const auto dir = testing::scratch_dir("cli_report_errors");
  const std::string base = kvlm_binary() + " report --model " + model.string() + " --text " + text.string();
  const auto bad = run_command(base + " --config huge --out " + (dir / "a").string());
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("'huge' is not one of: full, quick"), std::string::npos) << bad.err;
  std::ofstream(dir / "file") << "x";
  const auto file = run_command(base + " --config quick --no-plots --out " + (dir / "file").string());
  EXPECT_EQ(file.exit_code, 1);
  EXPECT_NE(file.err.find("cannot create the output folder"), std::string::npos) << file.err;
}

// The planner's prediction and the live pool agree within one partially filled block per
// sequence and layer, for every codec and several block sizes and lengths.
TEST(CliRun, PlannerPredictionMatchesTheLivePool) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  for (KvType type : all_kv_types()) {
    for (int block_size : {1, 7, 16}) {
      for (int max_tokens : {1, 20}) {
        const auto r = run_command(kvlm_binary() + " run --model " + model.string() +
                                   " --prompt 'Once upon a time' --temp 0 --json --threads 1 --max-tokens " +
                                   std::to_string(max_tokens) + " --block-size " + std::to_string(block_size) +
                                   " --kv-type " + std::string(kv_type_name(type)));
        ASSERT_EQ(r.exit_code, 0) << r.err;
        const auto stats = nlohmann::json::parse(r.out)["stats"];
        const auto planner = stats["kv_planner"];
        SCOPED_TRACE(std::string(kv_type_name(type)) + " block " + std::to_string(block_size));
        const double formula = planner["formula_bytes"].get<double>();
        const auto live = stats["kv_bytes_allocated"].get<uint64_t>();
        EXPECT_EQ(planner["live_bytes"].get<uint64_t>(), live);
        EXPECT_EQ(planner["block_bytes"].get<uint64_t>(), live);  // whole blocks, exactly
        EXPECT_GE(static_cast<double>(live), formula);
        EXPECT_LE(static_cast<double>(live), formula + planner["slack_bytes"].get<double>());
        EXPECT_TRUE(planner["agrees"].get<bool>());
      }
    }
  }
}

// KIVI's f32 staging stays within the planner's per-sequence bound across windows (sequences
// freed and reallocated) and long prefill steps, with and without a residual window.
TEST(CliEval, KiviStagingStaysWithinThePlannersBound) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  KVLM_REQUIRE_SHARED(text, "tinystories_valid_head.txt");
  for (const char* type : {"kivi4", "kivi2"}) {
    for (int residual : {0, 40, 128}) {
      const auto r = run_command(kvlm_binary() + " eval ppl --model " + model.string() + " --text " + text.string() +
                                 " --ctx 128 --max-chunks 3 --threads 1 --json --kv-type " + type +
                                 " --kivi-residual " + std::to_string(residual));
      ASSERT_EQ(r.exit_code, 0) << r.err;
      const auto planner = nlohmann::json::parse(r.out)["kv_planner"];
      SCOPED_TRACE(planner.dump());
      EXPECT_TRUE(planner["agrees"].get<bool>());
      EXPECT_GT(planner["live_staging_bytes"].get<uint64_t>(), 0u);
      EXPECT_LE(planner["live_staging_bytes"].get<uint64_t>(), planner["staging_bytes"].get<uint64_t>());
    }
  }
  const auto bad = run_command(kvlm_binary() + " eval ppl --model " + model.string() + " --text " + text.string() +
                               " --kv-type kivi4 --kivi-residual -5");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("--kivi-residual -5 must be in [0,"), std::string::npos) << bad.err;
}

// --kv-rotate: int8 keys are stored rotated by default, which `eval ppl` says; off and on are
// honoured; anything else is a one-line error. Rotation costs no bytes.
TEST(CliEval, KeyRotationIsReportedAndSwitchable) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  KVLM_REQUIRE_SHARED(text, "tinystories_valid_head.txt");
  const std::string base =
      kvlm_binary() + " eval ppl --model " + model.string() + " --text " + text.string() + " --ctx 64 --max-chunks 2 --threads 1";
  struct Case {
    std::string flags;
    bool rotated;
  };
  for (const Case& c : {Case{"--kv-type int8", true}, Case{"--kv-type int8 --kv-rotate off", false},
                        Case{"--kv-type f16", false}, Case{"--kv-type f16 --kv-rotate on", true},
                        Case{"--kv-type kivi4", false}}) {
    SCOPED_TRACE(c.flags);
    const auto text_run = run_command(base + " " + c.flags);
    ASSERT_EQ(text_run.exit_code, 0) << text_run.err;
    EXPECT_EQ(text_run.out.find("(keys rotated)") != std::string::npos, c.rotated) << text_run.out;
    const auto json_run = run_command(base + " --json " + c.flags);
    ASSERT_EQ(json_run.exit_code, 0) << json_run.err;
    EXPECT_EQ(nlohmann::json::parse(json_run.out)["keys_rotated"].get<bool>(), c.rotated);
  }
  const auto bad = run_command(base + " --kv-type int8 --kv-rotate sometimes");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("--kv-rotate 'sometimes' is not one of: auto, on, off"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace kvlm
