// End-to-end tests of `kvlm bench-serve` on a synthetic tiny-gqa model: the JSON, the table, prefix hits,
// preemption in a tiny pool, and one-line errors. Counts only; no timing is asserted.
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

// tiny-gqa: vocab 512, context 256. Returns the command prefix `kvlm bench-serve -m MODEL -t 1`.
std::string bench_serve_with_tiny_model(const std::string& test_name) {
  const std::string model = (testing::scratch_dir(test_name) / "tiny-gqa.gguf").string();
  const auto s = run_command(kvlm_binary() + " synth --preset tiny-gqa --out " + model);
  EXPECT_EQ(s.exit_code, 0) << s.err;
  return kvlm_binary() + " bench-serve -m " + model + " -t 1";
}

// 8 requests, 4 at a time, 48 prompt tokens (3 blocks of 16) + 8 output tokens: 4 blocks each.
constexpr const char* kSmallRun = " --requests 8 --concurrency 4 --prompt-tokens 48 --output-tokens 8";

nlohmann::json run_json(const std::string& command) {
  const auto r = run_command(command + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;  // no progress line: stderr is not a terminal here
  return nlohmann::json::parse(r.out);
}

TEST(CliBenchServe, JsonHasEveryFieldAndExactCounts) {
  const std::string base = bench_serve_with_tiny_model("bench_serve_json");
  const auto j = run_json(base + kSmallRun + " --shared-prefix 0.9 --seed 7");
  for (const char* key :
       {"model", "config", "requests_completed", "requests_errored", "requests_short", "errors", "prompt_tokens_total",
        "output_tokens_total", "wall_seconds", "requests_per_s", "output_tokens_per_s", "total_tokens_per_s", "ttft_s",
        "tpot_s", "prefix", "pool", "preemptions", "steps", "tokens_computed"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  for (const char* key : {"requests", "concurrency", "prompt_tokens", "output_tokens", "shared_prefix",
                          "shared_prefix_tokens", "type_k", "type_v", "block_size", "pool_blocks", "pool_blocks_auto",
                          "max_batch_tokens", "max_seqs", "threads", "seed", "sampling", "temperature", "top_k",
                          "top_p", "min_p"}) {
    EXPECT_TRUE(j["config"].contains(key)) << key;
  }
  EXPECT_EQ(j["config"]["sampling"].get<std::string>(), "greedy");
  for (const char* key : {"p50", "p99", "mean"}) {
    EXPECT_TRUE(j["ttft_s"][key].is_number()) << key;
    EXPECT_TRUE(j["tpot_s"][key].is_number()) << key;
  }
  EXPECT_TRUE(j["tpot_s"]["method"].is_string());
  for (const char* key : {"hit_tokens", "query_tokens", "hit_rate", "cached_prompt_tokens"}) {
    EXPECT_TRUE(j["prefix"].contains(key)) << key;
  }
  for (const char* key : {"blocks_total", "peak_blocks_used", "bytes_per_block", "peak_bytes", "total_bytes",
                          "blocks_leaked", "blocks_used_at_end"}) {
    EXPECT_TRUE(j["pool"].contains(key)) << key;
  }

  EXPECT_EQ(j["config"]["shared_prefix_tokens"].get<int>(), 43);  // round(0.9 * 48)
  EXPECT_EQ(j["config"]["max_seqs"].get<int>(), 4);               // defaults to --concurrency
  EXPECT_EQ(j["config"]["type_k"].get<std::string>(), "f32");
  // The default pool: 4 in flight x ceil(56 / 16) blocks, plus ceil(43 / 16) for the shared prefix.
  EXPECT_TRUE(j["config"]["pool_blocks_auto"].get<bool>());
  EXPECT_EQ(j["config"]["pool_blocks"].get<int>(), 4 * 4 + 3);
  EXPECT_EQ(j["pool"]["blocks_total"].get<int>(), 19);

  EXPECT_EQ(j["requests_completed"].get<int>(), 8);
  EXPECT_EQ(j["requests_errored"].get<int>(), 0);
  EXPECT_EQ(j["requests_short"].get<int>(), 0);
  EXPECT_TRUE(j["errors"].empty());
  EXPECT_EQ(j["prompt_tokens_total"].get<int64_t>(), 8 * 48);
  EXPECT_EQ(j["output_tokens_total"].get<int64_t>(), 8 * 8);
  EXPECT_EQ(j["preemptions"].get<int64_t>(), 0);  // the default pool holds every request in flight
  EXPECT_EQ(j["pool"]["blocks_leaked"].get<int>(), 0);
  EXPECT_EQ(j["pool"]["blocks_used_at_end"].get<int>(), 0);
  const int peak = j["pool"]["peak_blocks_used"].get<int>();
  EXPECT_GT(peak, 0);
  EXPECT_LE(peak, 19);
  EXPECT_EQ(j["pool"]["peak_bytes"].get<uint64_t>(),
            static_cast<uint64_t>(peak) * j["pool"]["bytes_per_block"].get<uint64_t>());

  // The first 4 requests start together, before any block is published; the next 4 find the
  // shared prefix's 2 full blocks.
  EXPECT_GT(j["prefix"]["hit_rate"].get<double>(), 0.0);
  EXPECT_EQ(j["prefix"]["cached_prompt_tokens"].get<int64_t>(), 4 * 32);
  EXPECT_GE(j["ttft_s"]["p99"].get<double>(), j["ttft_s"]["p50"].get<double>());
}

TEST(CliBenchServe, NoSharedPrefixGivesNoHits) {
  const std::string base = bench_serve_with_tiny_model("bench_serve_no_prefix");
  const auto j = run_json(base + kSmallRun + " --shared-prefix 0");
  EXPECT_EQ(j["config"]["shared_prefix_tokens"].get<int>(), 0);
  EXPECT_EQ(j["requests_completed"].get<int>(), 8);
  EXPECT_EQ(j["output_tokens_total"].get<int64_t>(), 64);
  EXPECT_EQ(j["preemptions"].get<int64_t>(), 0);
  EXPECT_GT(j["prefix"]["query_tokens"].get<int64_t>(), 0);
  EXPECT_EQ(j["prefix"]["hit_tokens"].get<int64_t>(), 0);
  EXPECT_EQ(j["prefix"]["hit_rate"].get<double>(), 0.0);
  EXPECT_EQ(j["pool"]["blocks_leaked"].get<int>(), 0);
}

// 6 blocks hold one request's 4 but not two: requests that grow into a full pool are preempted,
// come back, and still produce every token; every block is back at the end.
TEST(CliBenchServe, TinyPoolPreemptsAndLeaksNothing) {
  const std::string base = bench_serve_with_tiny_model("bench_serve_tiny_pool");
  const auto j = run_json(base + kSmallRun + " --shared-prefix 0 --pool-blocks 6");
  EXPECT_FALSE(j["config"]["pool_blocks_auto"].get<bool>());
  EXPECT_EQ(j["pool"]["blocks_total"].get<int>(), 6);
  EXPECT_GT(j["preemptions"].get<int64_t>(), 0);
  EXPECT_EQ(j["requests_completed"].get<int>(), 8);
  EXPECT_EQ(j["requests_errored"].get<int>(), 0);
  EXPECT_EQ(j["output_tokens_total"].get<int64_t>(), 64);
  EXPECT_EQ(j["pool"]["peak_blocks_used"].get<int>(), 6);
  EXPECT_EQ(j["pool"]["blocks_leaked"].get<int>(), 0);
  EXPECT_EQ(j["pool"]["blocks_used_at_end"].get<int>(), 0);
}

TEST(CliBenchServe, TableOnStdout) {
  const std::string base = bench_serve_with_tiny_model("bench_serve_table");
  const auto r = run_command(base + kSmallRun + " --shared-prefix 0.5 --kv-type int8 --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;
  for (const char* text : {"| requests completed", "| 8 / 8", "| output tokens/s", "| time to first token p99",
                           "| time per output token p50", "| prefix hit rate", "| peak pool usage", "| preemptions",
                           "| blocks leaked at the end", "KV int8, block size 16", "first 24 shared",
                           "time per output token: per request"}) {
    EXPECT_NE(r.out.find(text), std::string::npos) << text << "\n" << r.out;
  }
  EXPECT_EQ(r.out.find('{'), std::string::npos) << r.out;
}

TEST(CliBenchServe, BadFlagsGiveOneLineErrors) {
  const std::string base = bench_serve_with_tiny_model("bench_serve_bad_flags");
  struct Case {
    std::string flags;
    std::string expected;
  };
  for (const Case& c : {
           Case{"--requests 0", "--requests 0 must be >= 1"},
           Case{"--requests 4 --concurrency 0", "--concurrency 0 must be in [1, --requests 4]"},
           Case{"--requests 4 --concurrency 5", "--concurrency 5 must be in [1, --requests 4]"},
           Case{"--requests 4 --concurrency 2 --prompt-tokens 0", "--prompt-tokens 0 must be >= 1"},
           Case{"--requests 4 --concurrency 2 --output-tokens 0", "--output-tokens 0 must be >= 1"},
           Case{"--requests 4 --concurrency 2 --shared-prefix 1.5", "--shared-prefix 1.5 must be a fraction in [0, 1]"},
           Case{"--requests 4 --concurrency 2 --shared-prefix -0.1", "--shared-prefix -0.1 must be"},
           Case{"--requests 4 --concurrency 2 --pool-blocks 0", "--pool-blocks 0 must be >= 1"},
           Case{"--requests 4 --concurrency 2 --max-seqs 0", "--max-seqs 0 must be >= 1"},
           Case{"--requests 4 --concurrency 2 --block-size 0", "--block-size 0 must be in [1, 4096]"},
           Case{"--requests 4 --concurrency 2 --kv-type q9", "--kv-type 'q9'"},
           Case{"--requests 4 --concurrency 2 --temp 1 --top-p 0", "--top-p 0 must be in (0, 1]"},
           Case{"--requests 4 --concurrency 2 --temp 1 --min-p 2", "--min-p 2 must be in [0, 1]"},
           Case{"--requests 4 --concurrency 2 --prompt-tokens 250 --output-tokens 10",
                "--prompt-tokens 250 + --output-tokens 10 = 260 exceeds the model's context of 256"},
           // The engine's own submit error, for a request that could never fit the pool.
           Case{"--requests 4 --concurrency 2 --prompt-tokens 48 --output-tokens 8 --pool-blocks 3",
                "needs up to 4 KV blocks (48 prompt + 8 new tokens) but the pool has only 3"},
       }) {
    SCOPED_TRACE(c.flags);
    const auto r = run_command(base + " " + c.flags);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find(c.expected), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

}  // namespace
}  // namespace kvlm

namespace kvlm {
namespace {

// The planner's --batch rows describe something that runs: the pool `kvlm plan --batch 4 --ctx 256`
// sizes for f16 runs 4 concurrent sequences of 256 tokens in the engine without a preemption, and
// the engine's peak bytes never pass the planner's total.
TEST(CliBenchServe, PlannerBatchRowRunsInTheEngine) {
  const std::string model = (testing::scratch_dir("bench_serve_plan") / "tiny-gqa.gguf").string();
  ASSERT_EQ(run_command(kvlm_binary() + " synth --preset tiny-gqa --out " + model).exit_code, 0);
  const auto p = run_command(kvlm_binary() + " plan --model " + model + " --ctx 256 --batch 4 --json");
  ASSERT_EQ(p.exit_code, 0) << p.err;
  const nlohmann::json plan = nlohmann::json::parse(p.out);
  const nlohmann::json* f16 = nullptr;
  for (const auto& row : plan["rows"]) {
    if (row["k_type"] == "f16" && row["v_type"] == "f16" && row["policy"] == "full") f16 = &row;
  }
  ASSERT_NE(f16, nullptr) << p.out;
  const int blocks = (*f16)["blocks_per_sequence"].get<int>() * 4;
  const auto r = run_command(kvlm_binary() + " bench-serve -m " + model + " -t 1 --kv-type f16 --requests 8 " +
                             "--concurrency 4 --prompt-tokens 200 --output-tokens 56 --shared-prefix 0 " +
                             "--pool-blocks " + std::to_string(blocks) + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["requests_completed"], 8);
  EXPECT_EQ(j["preemptions"], 0);
  EXPECT_EQ(j["pool"]["blocks_leaked"], 0);
  EXPECT_EQ(j["pool"]["bytes_per_block"], (*f16)["bytes_per_block"]);
  EXPECT_LE(j["pool"]["peak_bytes"].get<double>(), (*f16)["total_bytes_blocks"].get<double>());
}

// Sampled requests (OpenAI's defaults: temperature 1, no cut), drawn over the pool within a step
// (EngineScheduleTest checks such draws batched against each request alone), all complete.
TEST(CliBenchServe, SampledRequestsComplete) {
  const std::string base = bench_serve_with_tiny_model("bench_serve_sampled");
  const auto a = run_json(base + kSmallRun + " --temp 1 --seed 3");
  EXPECT_EQ(a["config"]["sampling"].get<std::string>(), "temperature 1, top-k off, top-p 1, min-p 0");
  EXPECT_EQ(a["requests_completed"], a["config"]["requests"]);
  EXPECT_EQ(a["requests_errored"].get<int>(), 0);
  EXPECT_EQ(a["output_tokens_total"].get<int>(), 8 * 8);
  EXPECT_EQ(a["pool"]["blocks_leaked"].get<int>(), 0);
}

}  // namespace
}  // namespace kvlm
