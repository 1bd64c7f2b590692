// Start-up figures: `kvlm bench` (text and JSON, --cold) and `kvlm run --stats` report the load
// (bytes mapped, page-cache residency before, bytes copied) and the time to the first token.
#include <filesystem>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/page_cache.h"
#include "support/subprocess.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

using testing::kvlm_binary;
using testing::run_command;

TEST(CliStartup, BenchJsonHoldsTheLoadAndFirstToken) {
  const std::string model = testing::synthesize_model("cli_startup_json", "--preset tiny-gqa --seed 5");
  const auto r = run_command(fmt::format("{} bench -m {} -p 12 -n 2 -r 1 --no-probe --json", kvlm_binary(), model));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json s = nlohmann::json::parse(r.out).at("startup");
  EXPECT_FALSE(s.at("cold").get<bool>());
  EXPECT_EQ(s.at("first_token_prompt_tokens").get<int>(), 12);
  EXPECT_GT(s.at("first_token_seconds").get<double>(), 0.0);
  const nlohmann::json& load = s.at("load");
  EXPECT_GT(load.at("seconds").get<double>(), 0.0);
  EXPECT_EQ(load.at("file_bytes").get<uint64_t>(), std::filesystem::file_size(model));
  EXPECT_TRUE(load.at("mapped").get<bool>());
  // Only norms (f32 vectors) are copied from a tiny llama file: far less than the file.
  EXPECT_GT(load.at("copied_bytes").get<uint64_t>(), 0u);
  EXPECT_LT(load.at("copied_bytes").get<uint64_t>(), load.at("file_bytes").get<uint64_t>() / 10);
}

// --cold drops the file's pages first: the residency before the load says so, where the
// filesystem honours posix_fadvise (tmpfs keeps its pages: then the line says 100%, truthfully).
TEST(CliStartup, ColdDropsTheFileFromThePageCache) {
  const std::string model = testing::synthesize_model("cli_startup_cold", "--preset tiny-gqa --seed 5");
  ASSERT_TRUE(drop_from_page_cache(model).ok());
  const auto after_drop = page_cache_resident_bytes(model);
  ASSERT_TRUE(after_drop.ok()) << after_drop.status().message();
  if (*after_drop != 0) GTEST_SKIP() << "this filesystem keeps the file's pages after POSIX_FADV_DONTNEED";
  const auto r =
      run_command(fmt::format("{} bench -m {} -p 4 -n 0 -r 1 --no-probe --json --cold", kvlm_binary(), model));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json s = nlohmann::json::parse(r.out).at("startup");
  EXPECT_TRUE(s.at("cold").get<bool>());
  EXPECT_EQ(s.at("load").at("resident_bytes_before").get<uint64_t>(), 0u);
  // The load and the first token read the file back in.
  const auto resident = page_cache_resident_bytes(model);
  ASSERT_TRUE(resident.ok());
  EXPECT_GT(*resident, 0u);
  const auto text = run_command(fmt::format("{} bench -m {} -p 4 -n 0 -r 1 --no-probe --cold", kvlm_binary(), model));
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("start-up (--cold: the file dropped from the page cache): load"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("(0% in the page cache before)"), std::string::npos) << text.out;
}

TEST(CliStartup, ResidencyOfAMissingFileIsAnError) {
  const auto r = page_cache_resident_bytes("/nonexistent/model.gguf");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("/nonexistent/model.gguf: cannot open"), std::string::npos);
  EXPECT_FALSE(drop_from_page_cache("/nonexistent/model.gguf").ok());
  const auto cold = run_command(kvlm_binary() + " bench -m /nonexistent/model.gguf --cold --no-probe");
  EXPECT_NE(cold.exit_code, 0);
  EXPECT_NE(cold.err.find("/nonexistent/model.gguf: cannot open"), std::string::npos) << cold.err;
}

TEST(CliStartup, RunStatsPrintsTheStartUpLine) {
  const auto embedded = run_command(kvlm_binary() + " run -n 4 --stats --temp 0");
  ASSERT_EQ(embedded.exit_code, 0) << embedded.err;
  EXPECT_NE(embedded.err.find("MB from memory (copied to aligned storage); first token"), std::string::npos)
      << embedded.err;
  const std::string model = testing::synthesize_model("cli_startup_run", "--preset tiny-gqa --seed 5");
  const auto file = run_command(fmt::format("{} run -m {} -n 4 --stats --temp 0", kvlm_binary(), model));
  ASSERT_EQ(file.exit_code, 0) << file.err;
  EXPECT_NE(file.err.find("MB mapped ("), std::string::npos) << file.err;
  const auto json = run_command(fmt::format("{} run -m {} -n 4 --json --temp 0", kvlm_binary(), model));
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const nlohmann::json j = nlohmann::json::parse(json.out);
  const nlohmann::json& stats = j.at("stats");
  EXPECT_TRUE(stats.at("load").at("mapped").get<bool>());
  EXPECT_GT(stats.at("first_token_seconds").get<double>(), 0.0);
}

}  // namespace
}  // namespace kvlm
