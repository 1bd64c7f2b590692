// scripts/bench-vs-llamacpp.sh: kvlm beside llama.cpp's llama-bench on one file, one table of
// medians, ratios and bandwidth shares. Skips when the anchors are absent.
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/subprocess.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

using testing::kvlm_binary;
using testing::run_command;

TEST(BenchVsLlamaCpp, OneTableOfBothEnginesWithRatiosAndBandwidthShares) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  const auto bench = testing::shared_anchor("llama.cpp/llama-bench");
  if (!bench) GTEST_SKIP() << "no llama.cpp llama-bench under the shared anchors";
  const std::filesystem::path anchors = bench->parent_path().parent_path();
  const std::string out = (testing::scratch_dir("bench_vs_llamacpp") / "table.json").string();
  const auto r = run_command(fmt::format("{}/scripts/bench-vs-llamacpp.sh {} -p 16 -n 4 -r 2 -t 1 --kv f16 --kvlm {} "
                                         "--anchors {} --json {}",
                                         KVLM_SOURCE_DIR, model.string(), kvlm_binary(), anchors.string(), out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("| test | llama.cpp t/s |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| kvlm / llama.cpp |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| pp16 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| tg4 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("medians of 2 interleaved repetitions"), std::string::npos) << r.out;
  std::ifstream in(out);
  const nlohmann::json j = nlohmann::json::parse(in);
  ASSERT_EQ(j["probes"].size(), 2u);  // one bandwidth probe before each repetition
  for (const auto& probe : j["probes"]) {
    EXPECT_GT(probe["bandwidth"]["median_gb_s"].get<double>(), 0.0);
    EXPECT_GT(probe["bandwidth"]["read_median_gb_s"].get<double>(), 0.0);
  }
  EXPECT_NE(r.out.find("bandwidth probed before each repetition on 1 thread: triad median "), std::string::npos)
      << r.out;
  ASSERT_EQ(j["rows"].size(), 2u);
  for (const auto& row : j["rows"]) {
    SCOPED_TRACE(row["test"].get<std::string>());
    EXPECT_GT(row["median_tps"]["kvlm"].get<double>(), 0.0);
    EXPECT_GT(row["median_tps"]["llama.cpp"].get<double>(), 0.0);
    EXPECT_EQ(row["samples_tps"]["kvlm"].size(), 2u);  // one sample per interleaved repetition
    EXPECT_EQ(row["samples_tps"]["llama.cpp"].size(), 2u);
    if (row["test"] == "tg4") {
      EXPECT_GT(row["bytes_per_token"].get<double>(), 0.0);
      EXPECT_GT(row["bandwidth_share"]["kvlm"].get<double>(), 0.0);
      EXPECT_GT(row["bandwidth_share"]["llama.cpp"].get<double>(), 0.0);
      EXPECT_GT(row["read_bandwidth_share"]["kvlm"].get<double>(), 0.0);
      EXPECT_GT(row["read_bandwidth_share"]["llama.cpp"].get<double>(), 0.0);
    }
  }
  // The footer names the CPU path each engine ran.
  EXPECT_NE(r.out.find("CPU paths (--isa auto): llama.cpp: libggml-cpu-"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("kvlm: kernel features "), std::string::npos) << r.out;
  // Bad arguments are one-line errors.
  const auto bad = run_command(fmt::format("{}/scripts/bench-vs-llamacpp.sh {} --kv q4", KVLM_SOURCE_DIR, model.string()));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--kv 'q4' is not one of: f16, bf16, q8"), std::string::npos) << bad.err;
  const auto bad_isa =
      run_command(fmt::format("{}/scripts/bench-vs-llamacpp.sh {} --isa sse", KVLM_SOURCE_DIR, model.string()));
  EXPECT_NE(bad_isa.exit_code, 0);
  EXPECT_NE(bad_isa.err.find("--isa 'sse' is not one of: auto, avx2"), std::string::npos) << bad_isa.err;
}

// --isa avx2 on any machine (every machine kvlm supports has AVX2): llama.cpp loads its haswell
// variant even where a better one exists, and kvlm runs its AVX2 kernels.
TEST(BenchVsLlamaCpp, Avx2ComparesTheAvx2PathsOfBothEngines) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  const auto bench = testing::shared_anchor("llama.cpp/llama-bench");
  if (!bench) GTEST_SKIP() << "no llama.cpp llama-bench under the shared anchors";
  if (!std::filesystem::exists(bench->parent_path() / "libggml-cpu-haswell.so")) {
    GTEST_SKIP() << "this llama.cpp build has no haswell CPU variant";
  }
  const std::filesystem::path anchors = bench->parent_path().parent_path();
  const std::string out = (testing::scratch_dir("bench_vs_llamacpp_avx2") / "table.json").string();
  const auto r = run_command(fmt::format("{}/scripts/bench-vs-llamacpp.sh {} -p 16 -n 4 -r 1 -t 1 -q --isa avx2 "
                                         "--kvlm {} --anchors {} --json {}",
                                         KVLM_SOURCE_DIR, model.string(), kvlm_binary(), anchors.string(), out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(out);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["isa"], "avx2");
  EXPECT_EQ(j["cpu_paths"]["llama.cpp"], "libggml-cpu-haswell.so") << r.out;
  EXPECT_EQ(j["cpu_paths"]["kvlm"], "kernel features avx2 fma f16c") << r.out;
  EXPECT_GT(j["rows"][0]["median_tps"]["llama.cpp"].get<double>(), 0.0);
  EXPECT_GT(j["rows"][0]["median_tps"]["kvlm"].get<double>(), 0.0);
}

}  // namespace
}  // namespace kvlm
