// End-to-end tests of token eviction through the CLI: StreamingLLM's flat stream past the trained
// context on stories260K, generation past the GGUF's context with flat memory, the policies in
// `eval ppl`, and one-line errors for bad eviction flags.
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

TEST(CliEvict, StreamingStaysAtInContextQualityWithFlatMemoryPastTheTrainedContext) {
  // StreamingLLM's central result, at CI size: 4,000 tokens (8x the trained 512), budget 256.
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  KVLM_REQUIRE_SHARED(text, "tinystories_valid_head.txt");
  const auto r = run_command(kvlm_binary() + " eval stream --model " + model.string() + " --text " + text.string() +
                             " --tokens 4000 --segment 512 --trained-ctx 512 --threads 2 --policy streaming "
                             "--budget 256 --sinks 4 --reference --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["policy"], "streaming");
  const auto& segments = j["segments"];
  ASSERT_EQ(segments.size(), 8u);
  const uint64_t bytes_per_block = j["kv_bytes_per_block"].get<uint64_t>();
  for (const auto& s : segments) {
    // Memory is flat: 256 live tokens, at most 2 blocks of evicted slots besides.
    EXPECT_EQ(s["kv_cached_tokens"].get<int>(), 256);
    EXPECT_LE(s["kv_blocks"].get<uint64_t>(), 256 / 16 + 2);
    EXPECT_EQ(s["kv_bytes"].get<uint64_t>(), s["kv_blocks"].get<uint64_t>() * bytes_per_block);
    // Every segment stays within 10% of the same text scored in context.
    EXPECT_LT(s["ppl"].get<double>(), 1.10 * s["reference_ppl"].get<double>()) << s.dump();
  }
  EXPECT_LT(j["max_segment_excess"].get<double>(), 0.10);
  EXPECT_TRUE(j["kv_planner"]["agrees"].get<bool>()) << j["kv_planner"].dump();
}

TEST(CliEvict, FullCacheDegradesPastTheContextWhereStreamingDoesNot) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  KVLM_REQUIRE_SHARED(text, "tinystories_valid_head.txt");
  const std::string base = kvlm_binary() + " eval stream --model " + model.string() + " --text " + text.string() +
                           " --tokens 3073 --segment 1024 --trained-ctx 512 --threads 2 --json";
  const auto full = run_command(base);
  const auto streaming = run_command(base + " --policy streaming --budget 256");
  ASSERT_EQ(full.exit_code, 0) << full.err;
  ASSERT_EQ(streaming.exit_code, 0) << streaming.err;
  const auto f = nlohmann::json::parse(full.out);
  const auto s = nlohmann::json::parse(streaming.out);
  // Positions 2048-3071 lie past the GGUF's context of 2048: the full cache falls apart there.
  const double full_last = f["segments"][2]["ppl"].get<double>();
  const double streaming_last = s["segments"][2]["ppl"].get<double>();
  EXPECT_GT(full_last, 3.0 * streaming_last) << full_last << " vs " << streaming_last;
  EXPECT_GT(f["kv_bytes_peak"].get<uint64_t>(), 10 * s["kv_bytes_peak"].get<uint64_t>());
}

TEST(CliEvict, SnapKvStreamCountsThePromptStepItHoldsBeforeCompressing) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  KVLM_REQUIRE_SHARED(text, "tinystories_valid_head.txt");
  const auto r = run_command(kvlm_binary() + " eval stream --model " + model.string() + " --text " + text.string() +
                             " --tokens 1200 --segment 400 --chunk 256 --trained-ctx 512 --threads 2 --policy snapkv "
                             "--budget 128 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const uint64_t bytes_per_block = j["kv_bytes_per_block"].get<uint64_t>();
  for (const auto& s : j["segments"]) EXPECT_EQ(s["kv_cached_tokens"].get<int>(), 128);  // compressed after each chunk
  // Between compressions a chunk of 256 runs whole on top of the 128 kept: 384 tokens, 24 blocks.
  EXPECT_GE(j["kv_bytes_peak"].get<uint64_t>(), 24 * bytes_per_block);
  EXPECT_TRUE(j["kv_planner"]["agrees"].get<bool>()) << j["kv_planner"].dump();
}

TEST(CliEvict, RunGeneratesPastTheModelsContextWithFlatMemoryAndNoLeak) {
  // stories260K's GGUF states a context of 2048: generate 2,600 tokens under streaming.
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  const auto r = run_command(kvlm_binary() + " run --model " + model.string() +
                             " -n 2600 --temp 0.8 --seed 3 --ignore-eos --policy streaming --budget 128 "
                             "--threads 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const auto& stats = j["stats"];
  EXPECT_EQ(stats["generated_tokens"].get<int>(), 2600);
  EXPECT_EQ(stats["kv_tokens_cached"].get<int>(), 128);
  EXPECT_EQ(stats["peak_live_tokens"].get<int>(), 128);
  EXPECT_EQ(stats["tokens_evicted"].get<int>(), 2601 - 128 - 1);  // every forwarded token but the 128 kept
  EXPECT_LE(stats["kv_blocks_peak"].get<int>(), 128 / 16 + 2);
  EXPECT_EQ(stats["blocks_leaked"].get<int>(), 0);
  EXPECT_TRUE(stats["kv_planner"]["agrees"].get<bool>()) << stats["kv_planner"].dump();
  // Without a policy the same request stops at the context.
  const auto full = run_command(kvlm_binary() + " run --model " + model.string() +
                                " -n 2600 --temp 0.8 --seed 3 --ignore-eos --threads 2 --json");
  ASSERT_EQ(full.exit_code, 0) << full.err;
  EXPECT_EQ(nlohmann::json::parse(full.out)["stats"]["generated_tokens"].get<int>(), 2048 - 1);
}

TEST(CliEvict, PerplexityUnderEachPolicyCostsQualityAndWithinTheBudgetNothing) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  KVLM_REQUIRE_SHARED(text, "tinystories_valid_head.txt");
  const std::string base = kvlm_binary() + " eval ppl --model " + model.string() + " --text " + text.string() +
                           " --ctx 128 --max-chunks 12 --threads 2 --json";
  const auto full = run_command(base);
  ASSERT_EQ(full.exit_code, 0) << full.err;
  const double full_ppl = nlohmann::json::parse(full.out)["ppl"].get<double>();
  for (const std::string policy : {"window", "streaming", "h2o", "snapkv"}) {
    // --snapkv-window is SnapKV's alone: any other policy refuses it.
    const std::string own = policy == "snapkv" ? " --snapkv-window 8" : "";
    const auto tight = run_command(base + " --policy " + policy + " --budget 40" + own);
    ASSERT_EQ(tight.exit_code, 0) << policy << ": " << tight.err;
    const auto t = nlohmann::json::parse(tight.out);
    EXPECT_GT(t["ppl"].get<double>(), full_ppl) << policy;
    EXPECT_EQ(t["policy"], policy);
    EXPECT_GT(t["eviction"]["tokens_evicted"].get<int>(), 0) << policy;
    EXPECT_TRUE(t["kv_planner"]["agrees"].get<bool>()) << policy << " " << t["kv_planner"].dump();
    const auto roomy = run_command(base + " --policy " + policy + " --budget 128" + own);
    ASSERT_EQ(roomy.exit_code, 0) << policy << ": " << roomy.err;
    EXPECT_DOUBLE_EQ(nlohmann::json::parse(roomy.out)["ppl"].get<double>(), full_ppl) << policy;
  }
}

TEST(CliEvict, BadEvictionFlagsGiveOneLineErrorsNamingTheFlag) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  const std::string run = kvlm_binary() + " run --model " + model.string() + " -n 4";
  struct Case {
    std::string flags;
    std::string expect;
  };
  for (const Case& c : {Case{"--policy lru --budget 8", "unknown eviction policy 'lru'"},
                        Case{"--policy window", "--budget"}, Case{"--policy streaming --budget 4 --sinks 4", "--sinks"},
                        Case{"--policy snapkv --budget 16", "--snapkv-window"},
                        Case{"--policy window --budget 8 --verify", "--verify"}}) {
    const auto r = run_command(run + " " + c.flags);
    EXPECT_EQ(r.exit_code, 1) << c.flags;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.flags << ": " << r.err;
  }
}

}  // namespace
}  // namespace kvlm
