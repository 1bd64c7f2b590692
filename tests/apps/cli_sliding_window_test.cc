// Gemma 3's sliding-window layers through the CLI: kvlm run and eval ppl keep only the windows of
// the local layers, the planner's window-aware prediction agrees with the live pool for every
// codec, and token eviction and KIVI combine with them.
#include <algorithm>
#include <cmath>
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

// gemma3-tiny: 6 layers, window 24, layer 5 global.
std::string gemma_file() {
  static const std::string path = [] {
    const std::string p = (testing::scratch_dir("cli_sliding_window") / "gemma3.gguf").string();
    const auto r = run_command(kvlm_binary() + " synth -o " + p + " --preset gemma3-tiny --seed 3");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return p;
  }();
  return path;
}

// Blocks a local layer may hold: the window plus the longest step (the prompt here), whole blocks.
int local_bound(int window, int block_size, int step) { return (window - 1 + step + block_size - 1) / block_size + 1; }

TEST(CliSlidingWindow, RunKeepsTheWindowsAndThePlannerAgreesForEveryCodec) {
  for (const char* kv : {"f32", "f16", "bf16", "fp8", "int8", "int4"}) {
    for (int block_size : {4, 16}) {
      SCOPED_TRACE(fmt::format("{} block {}", kv, block_size));
      const auto r = run_command(fmt::format("{} run -m {} -p 'Once upon a time there was' -n 150 --kv-type {} "
                                             "--block-size {} --json",
                                             kvlm_binary(), gemma_file(), kv, block_size));
      ASSERT_EQ(r.exit_code, 0) << r.err;
      const nlohmann::json j = nlohmann::json::parse(r.out);
      const nlohmann::json& s = j.at("stats");
      EXPECT_TRUE(s.at("kv_planner").at("agrees").get<bool>()) << s.at("kv_planner").dump();
      const int prompt = s.at("prompt_tokens").get<int>();
      const int local = s.at("kv_local_blocks_peak").get<int>();
      const int global = s.at("kv_blocks_peak").get<int>();
      EXPECT_GT(local, 0);
      EXPECT_LE(local, local_bound(24, block_size, prompt));
      EXPECT_LT(local, global);  // ~160 tokens against a window of 24
      EXPECT_EQ(s.at("blocks_leaked").get<int>(), 0);
    }
  }
}

TEST(CliSlidingWindow, VerifiedRunMatchesTheReference) {
  const auto r = run_command(fmt::format("{} run -m {} -p 'Once upon a time' -n 80 --block-size 4 --verify --json",
                                         kvlm_binary(), gemma_file()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json s = nlohmann::json::parse(r.out).at("stats");
  EXPECT_LE(s.at("verify_max_rel_error").get<double>(), 1e-4);
}

TEST(CliSlidingWindow, PerplexityInShortChunksKeepsTheWindowsAndAgrees) {
  KVLM_REQUIRE_SHARED(text, "tinystories_valid_head.txt");
  // Chunks of 8 tokens over 128-token windows: the local layers hold 24 + 8 tokens, not 128.
  const auto chunked = run_command(fmt::format("{} eval ppl -m {} -f {} -c 128 --max-chunks 4 --prefill-chunk 8 "
                                               "--block-size 4 --kv-type f16 --json",
                                               kvlm_binary(), gemma_file(), text.string()));
  ASSERT_EQ(chunked.exit_code, 0) << chunked.err;
  const nlohmann::json a = nlohmann::json::parse(chunked.out);
  EXPECT_TRUE(a.at("kv_planner").at("agrees").get<bool>()) << a.at("kv_planner").dump();
  // One step for the whole window: the same perplexity, every block held by every layer.
  const auto whole = run_command(fmt::format("{} eval ppl -m {} -f {} -c 128 --max-chunks 4 --block-size 4 "
                                             "--kv-type f16 --json",
                                             kvlm_binary(), gemma_file(), text.string()));
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  const nlohmann::json b = nlohmann::json::parse(whole.out);
  EXPECT_TRUE(b.at("kv_planner").at("agrees").get<bool>()) << b.at("kv_planner").dump();
  EXPECT_NEAR(a.at("ppl").get<double>(), b.at("ppl").get<double>(), 1e-4 * b.at("ppl").get<double>());
  EXPECT_LT(a.at("kv_planner").at("live_bytes").get<double>(), 0.5 * b.at("kv_planner").at("live_bytes").get<double>());
}

TEST(CliSlidingWindow, EvictionAndKiviCombineWithTheWindowsAndThePlannerAgrees) {
  for (const char* flags : {"--policy streaming --budget 32", "--policy h2o --budget 32", "--kv-type kivi4",
                            "--kv-type kivi4 --policy snapkv --budget 40"}) {
    SCOPED_TRACE(flags);
    const auto r = run_command(fmt::format("{} run -m {} -p 'Once upon a time there was' -n 100 --block-size 4 {} "
                                           "--json",
                                           kvlm_binary(), gemma_file(), flags));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json s = nlohmann::json::parse(r.out).at("stats");
    EXPECT_TRUE(s.at("kv_planner").at("agrees").get<bool>()) << s.at("kv_planner").dump();
    EXPECT_GT(s.at("kv_local_blocks_peak").get<int>(), 0);
    EXPECT_LE(s.at("kv_local_blocks_peak").get<int>(), local_bound(24, 4, s.at("prompt_tokens").get<int>()));
    EXPECT_EQ(s.at("blocks_leaked").get<int>(), 0);
  }
}

TEST(CliSlidingWindow, EvictingPerplexityRunsOverTheWindows) {
  KVLM_REQUIRE_SHARED(text, "tinystories_valid_head.txt");
  // A budget above the 128-token windows evicts nothing: the same perplexity as the full cache.
  const auto base = fmt::format("{} eval ppl -m {} -f {} -c 128 --max-chunks 3 --block-size 4 --json", kvlm_binary(),
                                gemma_file(), text.string());
  const auto full = run_command(base);
  const auto roomy = run_command(base + " --policy streaming --budget 200");
  const auto tight = run_command(base + " --policy streaming --budget 48");
  for (const auto* r : {&full, &roomy, &tight}) ASSERT_EQ(r->exit_code, 0) << r->err;
  const double p_full = nlohmann::json::parse(full.out).at("ppl").get<double>();
  const double p_roomy = nlohmann::json::parse(roomy.out).at("ppl").get<double>();
  const double p_tight = nlohmann::json::parse(tight.out).at("ppl").get<double>();
  EXPECT_NEAR(p_roomy, p_full, 1e-6 * p_full);
  EXPECT_NE(p_tight, p_full);  // the budget evicted tokens the global layer would have seen
  EXPECT_TRUE(std::isfinite(p_tight));
}

}  // namespace
}  // namespace kvlm
