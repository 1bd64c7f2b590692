// End-to-end tests of `kvlm bench`: the JSON rows on stories260K, the table, and one-line errors.
#include <algorithm>
#include <cmath>
#include <regex>
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

TEST(CliBench, JsonRowsOnStories) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  const auto r = run_command(kvlm_binary() + " bench -m " + model.string() +
                             " -p 32 -n 8 -d 0,64 -r 2 -t 1 --kv-type-v f16 --no-probe --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["threads"].get<int>(), 1);
  EXPECT_EQ(j["blocks_in_use_at_end"].get<int>(), 0);
  const uint64_t weights = j["weight_bytes_per_token"].get<uint64_t>();
  EXPECT_GT(weights, 0u);
  EXPECT_LT(weights, j["model_bytes"].get<uint64_t>() + 1);
  const auto& rows = j["rows"];
  ASSERT_EQ(rows.size(), 4u);
  const char* names[] = {"pp32", "tg8", "pp32 @ d64", "tg8 @ d64"};
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& row = rows[i];
    SCOPED_TRACE(names[i]);
    EXPECT_EQ(row["test"].get<std::string>(), names[i]);
    EXPECT_EQ(row["depth"].get<int>(), i < 2 ? 0 : 64);
    EXPECT_EQ(row["type_k"].get<std::string>(), "f32");
    EXPECT_EQ(row["type_v"].get<std::string>(), "f16");
    // stories260K: 5 layers x 4 KV heads x 8 dims, K f32 + V f16 = 5 * 32 * (4 + 2) bytes per token.
    EXPECT_EQ(row["kv_bytes_per_cached_token"].get<int>(), 5 * 32 * 6);
    ASSERT_EQ(row["samples_tps"].size(), 2u);
    for (const auto& s : row["samples_tps"]) EXPECT_GT(s.get<double>(), 0.0);
    const double mean = row["mean_tps"].get<double>();
    EXPECT_TRUE(std::isfinite(mean) && mean > 0);
    EXPECT_GE(row["stddev_tps"].get<double>(), 0.0);
    const double a = row["samples_tps"][0].get<double>(), b = row["samples_tps"][1].get<double>();
    EXPECT_DOUBLE_EQ(row["median_tps"].get<double>(), (a + b) / 2);
    if (i % 2 == 1) {
      EXPECT_EQ(row["kind"].get<std::string>(), "tg");
      EXPECT_EQ(row["gen_tokens"].get<int>(), 8);
      const double kv_read = (i < 2 ? 0 : 64) + 4.5;  // depth + (n + 1) / 2
      EXPECT_DOUBLE_EQ(row["kv_tokens_read"].get<double>(), kv_read);
      EXPECT_DOUBLE_EQ(row["bytes_per_token"].get<double>(), static_cast<double>(weights) + kv_read * 5 * 32 * 6);
      EXPECT_NEAR(row["gb_per_s"].get<double>(), row["bytes_per_token"].get<double>() * mean / 1e9,
                  1e-9 * row["gb_per_s"].get<double>());
    } else {
      EXPECT_EQ(row["kind"].get<std::string>(), "pp");
      EXPECT_EQ(row["prompt_tokens"].get<int>(), 32);
    }
  }
}

TEST(CliBench, TableAndMachineLine) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  const auto r = run_command(kvlm_binary() + " bench -m " + model.string() + " -p 16 -n 0 -d 0,32 -r 1 -t 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("| model"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| pp16 @ d32 |"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("tg"), std::string::npos) << r.out;  // -n 0 skips generation
  EXPECT_NE(r.out.find("threads: 1"), std::string::npos) << r.out;
}

// A list of codecs: each gets its rows at every depth, side by side, with its own bytes per token.
TEST(CliBench, SeveralCodecsSideBySide) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  const auto r = run_command(kvlm_binary() + " bench -m " + model.string() +
                             " -p 0 -n 4 -d 0,40 -r 3 -t 1 --kv-type f16,int8,int4 --fill random-kv --no-probe --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["blocks_in_use_at_end"].get<int>(), 0);
  const auto& rows = j["rows"];
  ASSERT_EQ(rows.size(), 6u);
  const char* types[] = {"f16", "int8", "int4"};
  // Bytes per token from the codecs' layouts: f16 2 per value; int8 1 + an f16 scale per
  // token and head; int4 one byte per 2 values + an f16 (scale, min) per group of 8.
  const int bytes[] = {5 * 32 * 2 * 2, 5 * 4 * (8 + 2) * 2, 5 * 4 * (4 + 4) * 2};
  for (size_t i = 0; i < rows.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(rows[i]["depth"].get<int>(), i < 3 ? 0 : 40);
    EXPECT_EQ(rows[i]["type_k"].get<std::string>(), types[i % 3]);
    EXPECT_EQ(rows[i]["type_v"].get<std::string>(), types[i % 3]);
    EXPECT_EQ(rows[i]["kv_bytes_per_cached_token"].get<int>(), bytes[i % 3]);
    EXPECT_EQ(rows[i]["samples_tps"].size(), 3u);
  }
  const auto table = run_command(kvlm_binary() + " bench -m " + model.string() +
                                 " -p 0 -n 2 -d 0 -r 1 -t 1 --kv-type f16,kivi4 --kv-type-v f32 --no-probe");
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("| f16    | f32    |"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("| kivi4  | f32    |"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("repetitions interleaved across the 2 codecs"), std::string::npos) << table.out;
}

// The roofline: a bandwidth probe before the tests, and each decode row's share of it.
TEST(CliBench, DecodeRowsReportTheirShareOfTheProbedBandwidth) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  const auto r = run_command(kvlm_binary() + " bench -m " + model.string() + " -p 8 -n 4 -r 1 -t 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const double bandwidth = j["bandwidth"]["median_gb_s"].get<double>();
  const double read_bandwidth = j["bandwidth"]["read_median_gb_s"].get<double>();
  EXPECT_GT(bandwidth, 0.0);
  EXPECT_GT(read_bandwidth, 0.0);
  EXPECT_EQ(j["bandwidth"]["threads"].get<int>(), 1);
  for (const auto& row : j["rows"]) {
    SCOPED_TRACE(row["test"].get<std::string>());
    if (row["kind"] == "tg") {
      EXPECT_NEAR(row["bandwidth_share"].get<double>(), row["gb_per_s"].get<double>() / bandwidth, 1e-12);
      EXPECT_GT(row["bandwidth_share"].get<double>(), 0.0);
      EXPECT_NEAR(row["read_bandwidth_share"].get<double>(), row["gb_per_s"].get<double>() / read_bandwidth, 1e-12);
    } else {
      EXPECT_EQ(row["bandwidth_share"].get<double>(), 0.0);
      EXPECT_EQ(row["read_bandwidth_share"].get<double>(), 0.0);
    }
  }
  const auto table = run_command(kvlm_binary() + " bench -m " + model.string() + " -p 0 -n 4 -r 1 -t 1");
  ASSERT_EQ(table.exit_code, 0) << table.err;
  // The headers, padded to their column's widest cell: on a loaded machine a decode row fitting in
  // cache can read at 1000% or more of the probed bandwidth, and "% BW" then takes 5 columns.
  EXPECT_TRUE(std::regex_search(table.out, std::regex(R"(\| +% BW \| +% read \|)"))) << table.out;
  EXPECT_NE(table.out.find("memory bandwidth (% BW and % read divide by its medians): triad"), std::string::npos)
      << table.out;
  const auto skipped = run_command(kvlm_binary() + " bench -m " + model.string() + " -p 0 -n 4 -r 1 -t 1 --no-probe --json");
  ASSERT_EQ(skipped.exit_code, 0) << skipped.err;
  const auto s = nlohmann::json::parse(skipped.out);
  EXPECT_TRUE(s["bandwidth"].is_null());
  EXPECT_EQ(s["rows"][0]["bandwidth_share"].get<double>(), 0.0);
  EXPECT_EQ(s["rows"][0]["read_bandwidth_share"].get<double>(), 0.0);
}

TEST(CliBench, ProbeMeasuresTheMachineAlone) {
  const auto r = run_command(kvlm_binary() + " bench --probe -t 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["bandwidth"]["median_gb_s"].get<double>(), 0.0);
  EXPECT_GE(j["bandwidth"]["best_gb_s"].get<double>(), j["bandwidth"]["median_gb_s"].get<double>());
  EXPECT_EQ(j["bandwidth"]["samples_gb_s"].size(), 5u);
  EXPECT_GE(j["bandwidth"]["read_best_gb_s"].get<double>(), j["bandwidth"]["read_median_gb_s"].get<double>());
  EXPECT_GT(j["bandwidth"]["read_median_gb_s"].get<double>(), 0.0);
  EXPECT_EQ(j["bandwidth"]["read_samples_gb_s"].size(), 5u);
  EXPECT_GE(j["bandwidth"]["array_bytes"].get<uint64_t>(), uint64_t{128} << 20);
  EXPECT_GT(j["matmul"]["median_gops"].get<double>(), 0.0);
  EXPECT_EQ(j["matmul"]["tokens"].get<int>(), 128);
  const auto text = run_command(kvlm_binary() + " bench --probe -t 1");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("memory bandwidth: triad"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("matrix throughput: Q8_0 matmul"), std::string::npos) << text.out;
  // Without a model and without --probe there is nothing to do; --probe with a model is one or the other.
  const auto none = run_command(kvlm_binary() + " bench -t 1");
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.err.find("bench needs a model (-m FILE), or --probe"), std::string::npos) << none.err;
  const auto both = run_command(kvlm_binary() + " bench --probe -m x.gguf");
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.err.find("--probe measures the machine alone"), std::string::npos) << both.err;
  const auto contradictory = run_command(kvlm_binary() + " bench --probe --no-probe");
  EXPECT_NE(contradictory.exit_code, 0);
  EXPECT_NE(contradictory.err.find("--no-probe"), std::string::npos) << contradictory.err;
}

TEST(CliBench, BadFlagsGiveOneLineErrors) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  const std::string base = kvlm_binary() + " bench -m " + model.string();
  struct Case {
    std::string flags;
    std::string expected;
  };
  for (const Case& c : {Case{"-d 0,-5", "-d -5 must be >= 0"}, Case{"-r 0", "--reps 0"},
                        Case{"-p 512 -n 128 -d 4096", "exceeds the model's context of 2048"},
                        Case{"--kv-type q9", "--kv-type 'q9'"}, Case{"--kv-type f16,,int8", "--kv-type ''"},
                        Case{"--kv-type f16,q9", "--kv-type 'q9'"}}) {
    SCOPED_TRACE(c.flags);
    const auto r = run_command(base + " " + c.flags);
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find(c.expected), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

}  // namespace
}  // namespace kvlm
