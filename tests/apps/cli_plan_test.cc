// End-to-end tests of `kvlm plan`: JSON fields and seed numbers, the human table, --advise, errors.
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

nlohmann::json plan_json(const std::string& args) {
  const auto r = run_command(kvlm_binary() + " plan " + args + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.exit_code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
}

const nlohmann::json* row(const nlohmann::json& j, const std::string& label) {
  for (const auto& r : j["rows"]) {
    if (r["label"] == label) return &r;
  }
  return nullptr;
}

TEST(CliPlan, PresetJsonReproducesTheSeedNumbers) {
  const auto j = plan_json("--preset llama-2-7b --ctx 4000");
  ASSERT_TRUE(j.contains("rows"));
  for (const char* key : {"model", "ctx", "batch", "block_size", "weight_bytes", "weight_source",
                          "baseline_bytes_per_token"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["baseline_bytes_per_token"].get<double>(), 524288.0);
  EXPECT_EQ(j["weight_bytes"].get<uint64_t>(), 13480000000ull);  // 6.74e9 × 2 B (f16 default)
  const auto* f16 = row(j, "f16");
  ASSERT_NE(f16, nullptr);
  for (const char* key : {"bytes_per_token", "bytes_per_block", "total_bytes_formula", "total_bytes_blocks",
                          "ratio_to_baseline", "tokens_per_sequence", "k_type", "v_type", "form", "policy"}) {
    EXPECT_TRUE(f16->contains(key)) << key;
  }
  EXPECT_EQ((*f16)["bytes_per_token"].get<double>(), 524288.0);
  EXPECT_EQ((*f16)["total_bytes_formula"].get<double>(), 2097152000.0);
  EXPECT_EQ((*f16)["ratio_to_baseline"].get<double>(), 1.0);
  EXPECT_FALSE(f16->contains("fit"));

  const auto g = plan_json("--preset llama-3-8b --ctx 8192 --memory 24GiB --weight-type q8_0");
  const auto* g16 = row(g, "f16");
  ASSERT_NE(g16, nullptr);
  EXPECT_EQ((*g16)["ratio_to_baseline"].get<double>(), 0.25);
  EXPECT_EQ(g["weight_bytes"].get<uint64_t>(), 250937500ull * 34);  // ceil(8.03e9 / 32) q8_0 blocks
  ASSERT_TRUE(g16->contains("fit"));
  EXPECT_GT((*g16)["fit"]["sequences"].get<int64_t>(), 0);
}

TEST(CliPlan, ExplicitMlaShape) {
  const auto j = plan_json("--layers 1 --heads 32 --head-dim 128 --kv-lora-rank 512 --ctx 16");
  EXPECT_EQ(j["baseline_bytes_per_token"].get<double>(), 16384.0);  // 8,192 values × 2 B
  const auto* latent = row(j, "f16 latent");
  ASSERT_NE(latent, nullptr);
  EXPECT_EQ((*latent)["bytes_per_token"].get<double>(), 1024.0);  // 512 values × 2 B: 16× less
  EXPECT_EQ((*latent)["form"], "latent");
}

TEST(CliPlan, ModelFileAndHumanTable) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  const auto j = plan_json("--model " + model.string() + " --ctx 256 --batch 4 --memory 10MiB");
  EXPECT_EQ(j["model"]["num_layers"].get<int>(), 5);
  EXPECT_EQ(j["model"]["num_kv_heads"].get<int>(), 4);
  EXPECT_EQ(j["weight_source"], "tensor bytes of the GGUF");
  const auto* f32 = row(j, "f32");
  ASSERT_NE(f32, nullptr);
  EXPECT_EQ((*f32)["bytes_per_token"].get<double>(), 1280.0);  // 2 × 5 × 4 × 8 × 4 B
  EXPECT_EQ((*f32)["total_bytes_blocks"].get<uint64_t>(), 1280u * 256 * 4);

  const auto h = run_command(kvlm_binary() + " plan --model " + model.string() + " --ctx 256");
  ASSERT_EQ(h.exit_code, 0) << h.err;
  EXPECT_NE(h.out.find("bytes/token"), std::string::npos) << h.out;
  EXPECT_NE(h.out.find("1.25 KiB"), std::string::npos) << h.out;
  EXPECT_NE(h.out.find("f16 MHA (reference)"), std::string::npos) << h.out;
}

TEST(CliPlan, AdviseInJsonAndText) {
  const auto j = plan_json("--preset llama-3-8b --memory 80GiB --batch 16 --advise concurrency");
  ASSERT_TRUE(j.contains("advice"));
  const auto& a = j["advice"];
  EXPECT_EQ(a["scenario"], "concurrency");
  ASSERT_FALSE(a["chosen"].is_null());
  EXPECT_GE(a["chosen"]["fit"]["sequences"].get<int64_t>(), 16);
  EXPECT_FALSE(a["reasons"].empty());

  const auto t = run_command(kvlm_binary() + " plan --preset llama-3.2-1b --advise long-chat --memory 8GiB");
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_NE(t.out.find("advice (long-chat)"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("StreamingLLM"), std::string::npos) << t.out;
}

TEST(CliPlan, BadInputsAreOneLineErrors) {
  struct Case {
    std::string args;
    std::string says;
  };
  const Case cases[] = {
      {"--preset llama-9", "unknown preset 'llama-9'"},
      {"--preset llama-2-7b --memory 24XB", "bad memory size '24XB'"},
      {"--preset llama-2-7b --advise fast", "--advise 'fast' is not one of"},
      {"--preset llama-2-7b --advise limited-memory", "needs --memory"},
      {"--preset llama-2-7b --weight-type q5_k", "--weight-type 'q5_k'"},
      {"", "give exactly one of"},
      {"--preset llama-2-7b --layers 4", "give exactly one of"},
      {"--layers 4 --heads 6 --kv-heads 4 --head-dim 64", "not a multiple of kv heads 4"},
      {"--preset llama-2-7b --batch 0", "batch 0"},
      {"--model /nonexistent/m.gguf", "/nonexistent/m.gguf"},
  };
  for (const Case& c : cases) {
    const auto r = run_command(kvlm_binary() + " plan " + c.args);
    EXPECT_EQ(r.exit_code, 1) << c.args << ": " << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << c.args << ": " << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << c.args << ": " << r.err;
  }
}

}  // namespace
}  // namespace kvlm
