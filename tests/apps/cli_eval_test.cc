// End-to-end tests of `kvlm eval ppl`: JSON fields, the KLD round trip, and one-line errors.
#include <algorithm>
#include <fstream>
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

// Writes the first `bytes` of the shared evaluation text to a scratch file.
std::string text_prefix(const std::filesystem::path& source, const std::string& name, size_t bytes) {
  std::ifstream in(source, std::ios::binary);
  std::string text(bytes, '\0');
  in.read(text.data(), static_cast<std::streamsize>(bytes));
  text.resize(static_cast<size_t>(in.gcount()));
  const auto path = testing::scratch_dir(name) / "text.txt";
  std::ofstream(path, std::ios::binary) << text;
  return path.string();
}

TEST(CliEval, JsonHasAllFieldsAndKldRoundTrips) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  KVLM_REQUIRE_SHARED(source, "tinystories_valid_head.txt");
  const std::string text = text_prefix(source, "cli_eval_json", 100 * 1024);
  const std::string base = (testing::scratch_dir("cli_eval_base") / "base.bin").string();
  const std::string cmd = kvlm_binary() + " eval ppl --model " + model.string() + " --text " + text +
                          " --ctx 256 --max-chunks 8 --threads 2 --json";
  const auto b = run_command(cmd + " --kld-base " + base);
  ASSERT_EQ(b.exit_code, 0) << b.err;
  const auto jb = nlohmann::json::parse(b.out);
  for (const char* key : {"ppl", "ppl_stderr", "mean_nll", "tokens_scored", "windows", "kv_bytes_peak",
                          "kv_bytes_formula", "kv_bytes_per_token", "seconds"}) {
    EXPECT_TRUE(jb.contains(key)) << key;
  }
  EXPECT_EQ(jb["windows"].get<int>(), 8);
  // The planner's prediction for one window of 256 tokens matches the live pool's peak.
  EXPECT_TRUE(jb["kv_planner"]["agrees"].get<bool>()) << jb["kv_planner"].dump();
  EXPECT_EQ(jb["kv_planner"]["block_bytes"], jb["kv_bytes_peak"]);
  EXPECT_EQ(jb["tokens_scored"].get<int>(), 8 * 127);
  EXPECT_GE(jb["ppl"].get<double>(), 3.0);
  EXPECT_LE(jb["ppl"].get<double>(), 6.0);

  const auto s = run_command(cmd + " --kld " + base);
  ASSERT_EQ(s.exit_code, 0) << s.err;
  const auto js = nlohmann::json::parse(s.out);
  ASSERT_TRUE(js.contains("kld"));
  EXPECT_EQ(js["kld"]["mean_kld"].get<double>(), 0.0);
  EXPECT_EQ(js["kld"]["top1_agreement"].get<double>(), 1.0);

  const auto h = run_command(cmd + " --kv-type f16 --kld " + base);
  ASSERT_EQ(h.exit_code, 0) << h.err;
  const auto jh = nlohmann::json::parse(h.out)["kld"];
  for (const char* key : {"mean_kld", "kld_p99", "delta_ppl", "base_ppl", "top1_agreement", "rms_dp"}) {
    EXPECT_TRUE(jh.contains(key)) << key;
  }
  EXPECT_GE(jh["mean_kld"].get<double>(), 0.0);
  EXPECT_LT(jh["mean_kld"].get<double>(), 1e-3);
  EXPECT_GT(jh["top1_agreement"].get<double>(), 0.99);

  // A baseline made with another ctx is refused with a clear line.
  const auto m = run_command(kvlm_binary() + " eval ppl --model " + model.string() + " --text " + text +
                             " --ctx 128 --max-chunks 8 --kld " + base);
  EXPECT_EQ(m.exit_code, 1);
  EXPECT_EQ(count_lines(m.err), 1) << m.err;
  EXPECT_NE(m.err.find("--ctx 256"), std::string::npos) << m.err;
}

// A baseline from another model file (the F32 original of a quantized file) is refused unless
// --kld-other-model says so; then the tokens must still match one for one.
TEST(CliEval, KldAgainstAnotherModelFileNeedsTheFlag) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  KVLM_REQUIRE_SHARED(source, "tinystories_valid_head.txt");
  const std::string text = text_prefix(source, "cli_eval_other", 40 * 1024);
  const auto dir = testing::scratch_dir("cli_eval_other_model");
  const std::string copy = (dir / "copy.gguf").string();
  std::filesystem::copy_file(model, copy, std::filesystem::copy_options::overwrite_existing);
  const std::string base = (dir / "base.bin").string();
  const std::string args = " --text " + text + " --ctx 128 --max-chunks 4 --threads 2";
  const auto b = run_command(kvlm_binary() + " eval ppl --model " + model.string() + args + " --kld-base " + base);
  ASSERT_EQ(b.exit_code, 0) << b.err;

  const auto refused = run_command(kvlm_binary() + " eval ppl --model " + copy + args + " --kld " + base);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_EQ(count_lines(refused.err), 1) << refused.err;
  EXPECT_NE(refused.err.find("--kld-other-model"), std::string::npos) << refused.err;

  const auto other =
      run_command(kvlm_binary() + " eval ppl --model " + copy + args + " --json --kld-other-model --kld " + base);
  ASSERT_EQ(other.exit_code, 0) << other.err;
  const auto k = nlohmann::json::parse(other.out)["kld"];
  EXPECT_EQ(k["mean_kld"].get<double>(), 0.0);  // the same weights under another name
  EXPECT_EQ(k["baseline_model"].get<std::string>(), std::filesystem::path(model).filename().string());

  const auto alone = run_command(kvlm_binary() + " eval ppl --model " + copy + args + " --kld-other-model");
  EXPECT_EQ(alone.exit_code, 1);
  EXPECT_NE(alone.err.find("--kld-other-model needs --kld"), std::string::npos) << alone.err;
}

TEST(CliEval, MissingAndShortTextGiveOneLineErrors) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  const auto missing = run_command(kvlm_binary() + " eval ppl --model " + model.string() +
                                   " --text /nonexistent/none.txt");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_EQ(count_lines(missing.err), 1) << missing.err;
  EXPECT_NE(missing.err.find("none.txt"), std::string::npos) << missing.err;

  const auto path = testing::scratch_dir("cli_eval_short") / "short.txt";
  std::ofstream(path) << "Once upon a time there was a cat.";
  const auto short_text = run_command(kvlm_binary() + " eval ppl --model " + model.string() + " --text " +
                                      path.string() + " --ctx 256");
  EXPECT_EQ(short_text.exit_code, 1);
  EXPECT_EQ(count_lines(short_text.err), 1) << short_text.err;
  EXPECT_NE(short_text.err.find("256 tokens"), std::string::npos) << short_text.err;

  const auto bad_ctx = run_command(kvlm_binary() + " eval ppl --model " + model.string() + " --text " +
                                   path.string() + " --ctx 4");
  EXPECT_EQ(bad_ctx.exit_code, 1);
  EXPECT_EQ(count_lines(bad_ctx.err), 1) << bad_ctx.err;
}

}  // namespace
}  // namespace kvlm
