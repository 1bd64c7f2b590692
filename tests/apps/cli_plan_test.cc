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

// f16 streaming at 4096 for llama-3-8b at 32768 tokens: 4096 resident tokens in 256 + 2 blocks
// of 2 MiB (131,072 B/token × 16), beside the full cache's 2048 blocks.
TEST(CliPlan, PolicyRowsInJson) {
  const auto j = plan_json("--preset llama-3-8b --ctx 32768 --policy streaming --budget 4096");
  ASSERT_TRUE(j.contains("rows"));
  EXPECT_EQ(j["rows"].size(), 17u);  // the baseline, 8 codecs full, 8 codecs under streaming
  ASSERT_EQ(j["evictions"].size(), 1u);
  EXPECT_EQ(j["evictions"][0]["policy"], "streaming");
  EXPECT_EQ(j["evictions"][0]["budget"].get<int64_t>(), 4096);
  EXPECT_EQ(j["evictions"][0]["sinks"].get<int>(), 4);
  EXPECT_EQ(j["evictions"][0]["evicted_slot_blocks"].get<int>(), 2);
  const auto* s = row(j, "f16 + streaming 4096");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ((*s)["policy"], "streaming");
  EXPECT_EQ((*s)["token_budget"].get<int64_t>(), 4096);
  EXPECT_EQ((*s)["tokens_per_sequence"].get<int64_t>(), 4096);
  EXPECT_EQ((*s)["blocks_per_sequence"].get<int64_t>(), 258);
  EXPECT_EQ((*s)["policy_extra_blocks"].get<int64_t>(), 2);
  EXPECT_EQ((*s)["total_bytes_blocks"].get<uint64_t>(), 258ull * 2097152);
  const auto* full = row(j, "f16");
  ASSERT_NE(full, nullptr);
  EXPECT_EQ((*full)["total_bytes_blocks"].get<uint64_t>(), 2048ull * 2097152);
  for (const char* label : {"int8 + streaming 4096", "int4 + streaming 4096", "kivi4 + streaming 4096"}) {
    const auto* r = row(j, label);
    ASSERT_NE(r, nullptr) << label;
    EXPECT_EQ((*r)["blocks_per_sequence"].get<int64_t>(), 258) << label;
  }
  // Past the trained 8192 tokens: fine for streaming within it, said in the notes.
  EXPECT_TRUE(j["ctx_past_model_context"].get<bool>());
  bool flat_note = false;
  for (const auto& n : j["notes"]) flat_note |= n.get<std::string>().find("fine with streaming 4096") != std::string::npos;
  EXPECT_TRUE(flat_note) << j["notes"].dump();

  const auto h = plan_json("--preset llama-3-8b --ctx 32768 --policy h2o --budget 4096");
  const auto* h2o = row(h, "f16 + h2o 4096");
  ASSERT_NE(h2o, nullptr);
  EXPECT_EQ((*h2o)["blocks_per_sequence"].get<int64_t>(), 256);
  EXPECT_EQ((*h2o)["total_bytes_blocks"].get<uint64_t>(), 256ull * 2097152);
}

TEST(CliPlan, PolicyRowsInTheTableAndNotes) {
  const auto t =
      run_command(kvlm_binary() + " plan --preset llama-3-8b --ctx 32768 --policy window --budget 4096 --memory 24GiB");
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_NE(t.out.find("f16 + window 4096"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("tokens/seq"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("2 blocks of evicted slots"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("fine with window 4096"), std::string::npos) << t.out;
  EXPECT_EQ(t.out.find("the model was not trained that long"), std::string::npos) << t.out;

  // Without a policy the past-context warning stays.
  const auto f = run_command(kvlm_binary() + " plan --preset llama-3-8b --ctx 32768");
  ASSERT_EQ(f.exit_code, 0) << f.err;
  EXPECT_NE(f.out.find("the model was not trained that long"), std::string::npos) << f.out;
}

TEST(CliPlan, AdviseLongChatRecommendsStreaming) {
  const auto j = plan_json("--preset llama-3-8b --ctx 131072 --memory 24GiB --advise long-chat");
  ASSERT_TRUE(j.contains("advice"));
  const auto& a = j["advice"];
  ASSERT_FALSE(a["chosen"].is_null());
  EXPECT_EQ(a["chosen"]["policy"], "streaming");
  EXPECT_EQ(a["chosen"]["token_budget"].get<int64_t>(), 8192);
  EXPECT_EQ(a["chosen"]["sinks"].get<int>(), 4);
  EXPECT_NE(a["recommendation"].get<std::string>().find("--policy streaming --budget 8192 --sinks 4"),
            std::string::npos);
  EXPECT_EQ(j.dump().find("not implemented"), std::string::npos);

  const auto r = plan_json("--preset llama-3-8b --ctx 8192 --memory 24GiB --advise long-recall");
  ASSERT_FALSE(r["advice"]["chosen"].is_null());
  EXPECT_EQ(r["advice"]["chosen"]["policy"], "full");
  EXPECT_EQ(r["evictions"].size(), 0u);
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
      {"--preset llama-2-7b --weight-type q7_k", "--weight-type 'q7_k' is not a GGML weight type"},
      {"", "give exactly one of"},
      {"--preset llama-2-7b --layers 4", "give exactly one of"},
      {"--layers 4 --heads 6 --kv-heads 4 --head-dim 64", "not a multiple of kv heads 4"},
      {"--preset llama-2-7b --batch 0", "batch 0"},
      {"--model /nonexistent/m.gguf", "/nonexistent/m.gguf"},
      {"--preset llama-3-8b --policy streaming --budget 0", "--policy streaming needs --budget"},
      {"--preset llama-3-8b --policy streaming", "--policy streaming needs --budget"},
      {"--preset llama-3-8b --policy lru --budget 100", "unknown eviction policy 'lru'"},
      {"--preset llama-3-8b --policy snapkv --budget 1", "--policy snapkv needs --budget >= 2"},
      {"--preset llama-3-8b --budget 100", "--budget does nothing with --policy none"},
      {"--preset llama-3-8b --policy h2o --budget 100 --sinks 2", "--sinks does nothing with --policy h2o"},
      {"--preset llama-3-8b --policy streaming --budget 4 --sinks 4", "--sinks 4 must be in [0, --budget 4)"},
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
