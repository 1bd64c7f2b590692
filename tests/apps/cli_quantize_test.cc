// `kvlm quantize`: its files load, generate and say what they are; bad input is an error. (The
// type per tensor against llama-quantize: cli_quantize_mix_slow_test.cc.)
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "support/subprocess.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

namespace fs = std::filesystem;
using testing::kvlm_binary;
using testing::run_command;

constexpr const char* kShape = "--layers 4 --dim 256 --heads 4 --kv-heads 2 --head-dim 64 --ffn 768 --vocab 2048";

TEST(KvlmQuantize, Q4KMFileLoadsAndGenerates) {
  const fs::path dir = testing::scratch_dir("kvlm_quantize_run");
  const std::string f32 = (dir / "f32.gguf").string();
  const std::string q4 = (dir / "q4_k_m.gguf").string();
  ASSERT_EQ(run_command(fmt::format("{} synth -o {} {}", kvlm_binary(), f32, kShape)).exit_code, 0);
  const auto k = run_command(fmt::format("{} quantize {} {} --type q4_k_m", kvlm_binary(), f32, q4));
  ASSERT_EQ(k.exit_code, 0) << k.err;
  EXPECT_NE(k.out.find("q4_k x"), std::string::npos) << k.out;
  EXPECT_NE(k.out.find("q6_k x"), std::string::npos) << k.out;
  const auto r = run_command(fmt::format("{} run -m {} -p \"Once upon\" -n 16 --temp 0 --json", kvlm_binary(), q4));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("stats").at("generated_tokens").get<int>(), 16) << r.out;
  const auto i = run_command(fmt::format("{} inspect {}", kvlm_binary(), q4));
  EXPECT_NE(i.out.find("(general.file_type 15: Q4_K_M)"), std::string::npos) << i.out;
  EXPECT_NE(i.out.find("runs in kvlm     yes"), std::string::npos) << i.out;
}

// deepseek2: the 3-D expert stacks and MLA's attn_k_b / attn_v_b are quantized like matrices
// (ffn_down_exps as ffn_down); the router stays F32. The file loads and runs.
TEST(KvlmQuantize, Deepseek2ExpertsAreQuantizedAndTheRouterIsNot) {
  const fs::path dir = testing::scratch_dir("kvlm_quantize_deepseek2");
  const std::string f32 = (dir / "f32.gguf").string();
  const std::string q8 = (dir / "q8.gguf").string();
  ASSERT_EQ(run_command(fmt::format("{} synth -o {} --preset deepseek2-tiny-split --leading-dense-layers 1", kvlm_binary(), f32)).exit_code, 0);
  const auto k = run_command(fmt::format("{} quantize {} {} --type q8_0", kvlm_binary(), f32, q8));
  ASSERT_EQ(k.exit_code, 0) << k.err;
  const auto i = run_command(fmt::format("{} inspect {} --tensors", kvlm_binary(), q8));
  ASSERT_EQ(i.exit_code, 0) << i.err;
  for (const char* name : {"blk.1.ffn_gate_exps.weight", "blk.1.ffn_down_exps.weight", "blk.1.attn_k_b.weight",
                           "blk.1.attn_v_b.weight", "blk.1.ffn_up_shexp.weight"}) {
    const size_t at = i.out.find(name);
    ASSERT_NE(at, std::string::npos) << name << "\n" << i.out;
    EXPECT_NE(i.out.substr(at, i.out.find('\n', at) - at).find("q8_0"), std::string::npos) << name;
  }
  const size_t router = i.out.find("blk.1.ffn_gate_inp.weight");
  ASSERT_NE(router, std::string::npos);
  EXPECT_NE(i.out.substr(router, i.out.find('\n', router) - router).find("f32"), std::string::npos);
  const auto r = run_command(fmt::format("{} run -m {} -p \"Once upon\" -n 8 --temp 0 --json", kvlm_binary(), q8));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("stats").at("generated_tokens").get<int>(), 8) << r.out;
}

TEST(KvlmQuantize, BadInputIsAnError) {
  const fs::path dir = testing::scratch_dir("kvlm_quantize_bad");
  const std::string f32 = (dir / "f32.gguf").string();
  const std::string q8 = (dir / "q8.gguf").string();
  ASSERT_EQ(run_command(fmt::format("{} synth -o {} --preset tiny-gqa", kvlm_binary(), f32)).exit_code, 0);
  auto unknown = run_command(fmt::format("{} quantize {} {} --type q7_k", kvlm_binary(), f32, q8));
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_NE(unknown.err.find("unknown quantization type 'q7_k'"), std::string::npos) << unknown.err;
  ASSERT_EQ(run_command(fmt::format("{} quantize {} {} --type q8_0", kvlm_binary(), f32, q8)).exit_code, 0);
  auto twice = run_command(fmt::format("{} quantize {} {} --type q4_0", kvlm_binary(), q8, q8 + ".again"));
  EXPECT_NE(twice.exit_code, 0);
  EXPECT_NE(twice.err.find("already q8_0"), std::string::npos) << twice.err;
}

}  // namespace
}  // namespace kvlm
