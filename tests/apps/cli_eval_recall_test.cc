// End-to-end tests of `kvlm eval recall`: JSON points on stories260K, determinism, and one-line errors.
#include <algorithm>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/subprocess.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

using testing::kvlm_binary;
using testing::run_command;

int count_lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

TEST(CliEvalRecall, JsonPointsAreDeterministic) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  KVLM_REQUIRE_SHARED(text, "tinystories_valid_head.txt");
  const std::string cmd = kvlm_binary() + " eval recall --model " + model.string() + " --text " + text.string() +
                          " --distances 0,100 --trials 4 --span 16 --seed 3 --threads 2 --json";
  const auto a = run_command(cmd);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  const auto j = nlohmann::json::parse(a.out);
  EXPECT_EQ(j["mode"], "repeat");
  EXPECT_EQ(j["trials"].get<int>(), 4);
  EXPECT_EQ(j["span"].get<int>(), 16);
  EXPECT_NEAR(j["chance"].get<double>(), 1.0 / j["candidate_tokens"].get<int>(), 1e-12);
  ASSERT_EQ(j["points"].size(), 2u);
  EXPECT_EQ(j["points"][0]["distance"].get<int>(), 0);
  EXPECT_EQ(j["points"][1]["distance"].get<int>(), 100);
  EXPECT_EQ(j["points"][1]["prompt_tokens"].get<int>(), 1 + 2 * 16 + 100);
  for (const auto& p : j["points"]) {
    for (const char* key : {"accuracy", "accuracy_stderr", "control_accuracy", "control_stderr"}) {
      ASSERT_TRUE(p.contains(key)) << key;
      EXPECT_GE(p[key].get<double>(), 0.0);
      EXPECT_LE(p[key].get<double>(), 1.0);
    }
  }
  const auto b = run_command(cmd);
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(nlohmann::json::parse(b.out)["points"], j["points"]);
}

TEST(CliEvalRecall, PastContextAndBadModeGiveOneLineErrors) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  const std::string base = kvlm_binary() + " eval recall --model " + model.string() + " --trials 1 --span 8";
  const auto past = run_command(base + " --distances 600 --trained-ctx 512");
  EXPECT_EQ(past.exit_code, 1);
  EXPECT_EQ(count_lines(past.err), 1) << past.err;
  EXPECT_NE(past.err.find("--allow-past-context"), std::string::npos) << past.err;
  const auto allowed = run_command(base + " --distances 600 --trained-ctx 512 --allow-past-context --json");
  ASSERT_EQ(allowed.exit_code, 0) << allowed.err;
  EXPECT_TRUE(nlohmann::json::parse(allowed.out)["points"][0]["past_context"].get<bool>());
  const auto mode = run_command(base + " --mode nonsense");
  EXPECT_EQ(mode.exit_code, 1);
  EXPECT_EQ(count_lines(mode.err), 1) << mode.err;
  EXPECT_NE(mode.err.find("repeat, passkey"), std::string::npos) << mode.err;
}

}  // namespace
}  // namespace kvlm
