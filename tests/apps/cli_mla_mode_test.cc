// --mla on `kvlm eval ppl` and `kvlm bench`: the expanded form computes the perplexity the
// absorbed one does, the JSON says which ran, and a flag that cannot apply is an error naming it.
#include <cmath>
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

std::string text_file(const std::string& test) {
  const std::string path = (testing::scratch_dir(test) / "text.txt").string();
  std::string text;
  for (int i = 0; i < 40; ++i) text += fmt::format("Once upon a time there was a cat number {} who liked fish. ", i);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

double ppl(const std::string& model, const std::string& text, const std::string& flags) {
  const auto r =
      run_command(fmt::format("{} eval ppl -m {} -f {} -c 64 --max-chunks 4 --json {}", kvlm_binary(), model, text, flags));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.exit_code == 0 ? nlohmann::json::parse(r.out).at("ppl").get<double>() : -1;
}

// Both forms are exact rearrangements of one computation in f32 (the forward tests hold each within
// 1e-4 of the reference), over a dense and an MoE model.
TEST(CliMlaMode, ExpandedPerplexityEqualsAbsorbed) {
  const std::string text = text_file("cli_mla_text");
  for (const std::string preset : {"deepseek2-tiny-qlora", "deepseek2-tiny-moe"}) {
    const std::string model = testing::synthesize_model("cli_mla_" + preset, "--preset " + preset + " --seed 3");
    const double absorbed = ppl(model, text, "");
    const double expanded = ppl(model, text, "--mla expanded");
    ASSERT_GT(absorbed, 1.0) << preset;
    EXPECT_LE(std::fabs(expanded - absorbed) / absorbed, 1e-4) << preset << ": " << expanded << " vs " << absorbed;
  }
}

TEST(CliMlaMode, BenchReportsTheModeThatRan) {
  const std::string model = testing::synthesize_model("cli_mla_bench", "--preset deepseek2-tiny-qlora --seed 3");
  for (const std::string mode : {"absorbed", "expanded"}) {
    const auto r = run_command(fmt::format("{} bench -m {} -p 8 -n 2 -r 1 --no-probe --json --mla {}", kvlm_binary(),
                                           model, mode));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out).at("mla").get<std::string>(), mode);
  }
}

TEST(CliMlaMode, FlagsThatCannotApplyAreErrors) {
  const std::string text = text_file("cli_mla_errors_text");
  const std::string mla = testing::synthesize_model("cli_mla_errors", "--preset deepseek2-tiny-qlora --seed 3");
  const std::string gqa = testing::synthesize_model("cli_mla_errors_gqa", "--preset tiny-gqa --seed 3");
  struct Case {
    std::string command;
    std::string message;
  };
  const Case cases[] = {
      {fmt::format("eval ppl -m {} -f {} --mla folded", mla, text), "--mla 'folded' is not one of: absorbed, expanded"},
      {fmt::format("eval ppl -m {} -f {} --mla expanded", gqa, text), "is not an MLA model"},
      {fmt::format("bench -m {} -p 8 -n 0 --no-probe --mla expanded", gqa), "is not an MLA model"},
      {fmt::format("eval ppl -m {} -f {} -c 64 --mla expanded --policy window --budget 32", mla, text),
       "--mla expanded attends over every cached token: it cannot run --policy window"},
  };
  for (const Case& c : cases) {
    const auto r = run_command(kvlm_binary() + " " + c.command);
    EXPECT_NE(r.exit_code, 0) << c.command;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.command << "\n" << r.err;
  }
}

}  // namespace
}  // namespace kvlm
