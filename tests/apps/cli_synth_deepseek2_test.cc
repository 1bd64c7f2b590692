// `kvlm synth` for deepseek2: the presets, every MLA/MoE/YaRN flag landing in the file's keys and
// tensors, and one-line errors naming the bad flag or field.
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "gguf/gguf_file.h"
#include "support/subprocess.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

using testing::kvlm_binary;
using testing::run_command;

struct Synth {
  testing::CommandResult result;
  std::unique_ptr<GgufFile> file;  // null when synth failed
};

Synth synth(const std::string& test, const std::string& flags) {
  const std::string model = (testing::scratch_dir(test) / "model.gguf").string();
  Synth s;
  s.result = run_command(fmt::format("{} synth -o {} {}", kvlm_binary(), model, flags));
  if (s.result.exit_code == 0) {
    auto f = GgufFile::open(model);
    EXPECT_TRUE(f.ok()) << f.status().message();
    if (f.ok()) s.file = std::move(*f);
  }
  return s;
}

int64_t key_int(const GgufFile& f, const std::string& suffix) {
  auto v = f.get_int("deepseek2." + suffix);
  EXPECT_TRUE(v.ok()) << v.status().message();
  return v.ok() ? *v : -1;
}

double key_float(const GgufFile& f, const std::string& suffix) {
  auto v = f.get_float("deepseek2." + suffix);
  EXPECT_TRUE(v.ok()) << v.status().message();
  return v.ok() ? *v : -1;
}

std::vector<int64_t> dims(const GgufFile& f, const std::string& tensor) {
  const GgufTensorInfo* t = f.find_tensor(tensor);
  EXPECT_NE(t, nullptr) << tensor;
  return t ? t->dims : std::vector<int64_t>{};
}

TEST(CliSynthDeepseek2, EveryFlagReachesTheFile) {
  const Synth s = synth("synth_ds2_flags",
                        "--preset deepseek2-tiny-moe --mla-layout split --q-lora-rank 64 --kv-lora-rank 64 "
                        "--qk-nope-dim 16 --qk-rope-dim 32 --v-head-dim 64 --leading-dense-layers 2 --layers 4 "
                        "--experts 4 --experts-used 3 --shared-experts 2 --expert-ffn 64 --expert-gating sigmoid "
                        "--expert-bias 1 --expert-weights-norm 1 --expert-weights-scale 1.5 --rope-scaling yarn "
                        "--rope-factor 2 --rope-orig-ctx 32 --yarn-log-multiplier 0.25 --type q8_0");
  ASSERT_EQ(s.result.exit_code, 0) << s.result.err;
  EXPECT_NE(s.result.out.find("deepseek2, 4 layers"), std::string::npos) << s.result.out;
  EXPECT_NE(s.result.out.find("split"), std::string::npos) << s.result.out;
  const GgufFile& f = *s.file;
  EXPECT_EQ(key_int(f, "block_count"), 4);
  EXPECT_EQ(key_int(f, "attention.q_lora_rank"), 64);
  EXPECT_EQ(key_int(f, "attention.kv_lora_rank"), 64);
  EXPECT_EQ(key_int(f, "attention.head_count_kv"), 1);
  EXPECT_EQ(key_int(f, "attention.key_length"), 64 + 32);
  EXPECT_EQ(key_int(f, "attention.value_length"), 64);
  EXPECT_EQ(key_int(f, "attention.key_length_mla"), 16 + 32);
  EXPECT_EQ(key_int(f, "attention.value_length_mla"), 64);
  EXPECT_EQ(key_int(f, "rope.dimension_count"), 32);
  EXPECT_EQ(key_int(f, "leading_dense_block_count"), 2);
  EXPECT_EQ(key_int(f, "expert_count"), 4);
  EXPECT_EQ(key_int(f, "expert_used_count"), 3);
  EXPECT_EQ(key_int(f, "expert_shared_count"), 2);
  EXPECT_EQ(key_int(f, "expert_feed_forward_length"), 64);
  EXPECT_EQ(key_int(f, "expert_gating_func"), 2);
  EXPECT_EQ(*f.get_bool("deepseek2.expert_weights_norm"), true);
  EXPECT_EQ(key_float(f, "expert_weights_scale"), 1.5);
  EXPECT_EQ(*f.get_string("deepseek2.rope.scaling.type"), "yarn");
  EXPECT_EQ(key_float(f, "rope.scaling.factor"), 2.0);
  EXPECT_EQ(key_int(f, "rope.scaling.original_context_length"), 32);
  EXPECT_EQ(key_float(f, "rope.scaling.yarn_log_multiplier"), 0.25);
  EXPECT_EQ(dims(f, "blk.0.attn_q_a.weight"), (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(dims(f, "blk.0.attn_q_b.weight"), (std::vector<int64_t>{64, 4 * 48}));
  EXPECT_EQ(dims(f, "blk.0.attn_kv_a_mqa.weight"), (std::vector<int64_t>{64, 64 + 32}));
  EXPECT_EQ(dims(f, "blk.0.attn_k_b.weight"), (std::vector<int64_t>{16, 64, 4}));
  EXPECT_EQ(dims(f, "blk.0.attn_v_b.weight"), (std::vector<int64_t>{64, 64, 4}));
  EXPECT_EQ(dims(f, "blk.1.ffn_down.weight"), (std::vector<int64_t>{128, 64}));
  EXPECT_EQ(dims(f, "blk.2.ffn_down_exps.weight"), (std::vector<int64_t>{64, 64, 4}));
  EXPECT_EQ(dims(f, "blk.3.ffn_up_shexp.weight"), (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(dims(f, "blk.3.exp_probs_b.bias"), (std::vector<int64_t>{4}));
  EXPECT_EQ(f.find_tensor("blk.1.ffn_gate_inp.weight"), nullptr);  // a dense layer
  // 16-value k_b rows cannot be Q8_0 blocks: F32; the rest is Q8_0.
  EXPECT_EQ(f.find_tensor("blk.0.attn_k_b.weight")->type, GgmlType::kF32);
  EXPECT_EQ(f.find_tensor("blk.0.attn_v_b.weight")->type, GgmlType::kQ8_0);
}

TEST(CliSynthDeepseek2, ArchAloneStartsFromTheTinyPreset) {
  const Synth s = synth("synth_ds2_arch", "--arch deepseek2 --heads 2");
  ASSERT_EQ(s.result.exit_code, 0) << s.result.err;
  EXPECT_EQ(key_int(*s.file, "attention.head_count"), 2);
  EXPECT_EQ(key_int(*s.file, "attention.head_count_kv"), 2);  // kv_b layout: per-head lengths
  EXPECT_EQ(key_int(*s.file, "attention.key_length"), 48);
  EXPECT_EQ(key_int(*s.file, "expert_count"), 0);
  EXPECT_EQ(key_int(*s.file, "leading_dense_block_count"), 27);
  EXPECT_EQ(s.result.err, "");  // 27 layers without q_lora: a file llama.cpp reads
}

TEST(CliSynthDeepseek2, WarnsWhenLlamaCppWouldRefuseTheFile) {
  const Synth s = synth("synth_ds2_warn", "--preset deepseek2-tiny --layers 3");
  ASSERT_EQ(s.result.exit_code, 0) << s.result.err;
  EXPECT_NE(s.result.err.find("warning: llama.cpp reads a deepseek2 file without a q bottleneck"), std::string::npos)
      << s.result.err;
  const Synth q = synth("synth_ds2_nowarn", "--preset deepseek2-tiny --layers 3 --q-lora-rank 64");
  ASSERT_EQ(q.result.exit_code, 0) << q.result.err;
  EXPECT_EQ(q.result.err, "");
  const Synth e = synth("synth_ds2_noshared", "--preset deepseek2-tiny-moe --shared-experts 0");
  ASSERT_EQ(e.result.exit_code, 0) << e.result.err;
  EXPECT_NE(e.result.err.find("warning: llama.cpp needs shared experts"), std::string::npos) << e.result.err;
}

TEST(CliSynthDeepseek2, NoExpertsMakesEveryLayerDense) {
  const Synth s = synth("synth_ds2_dense", "--preset deepseek2-tiny-moe-sigmoid --experts 0 --layers 26");
  ASSERT_EQ(s.result.exit_code, 0) << s.result.err;
  EXPECT_EQ(key_int(*s.file, "leading_dense_block_count"), 26);
  EXPECT_EQ(key_int(*s.file, "expert_used_count"), 0);
  EXPECT_EQ(s.file->find_tensor("blk.25.ffn_gate_exps.weight"), nullptr);
  EXPECT_EQ(s.file->find_tensor("blk.25.exp_probs_b.bias"), nullptr);
  EXPECT_NE(s.file->find_tensor("blk.25.ffn_gate.weight"), nullptr);
}

TEST(CliSynthDeepseek2, NoYarnDropsTheLogMultiplier) {
  const Synth s = synth("synth_ds2_noyarn", "--preset deepseek2-tiny-yarn --rope-scaling none");
  ASSERT_EQ(s.result.exit_code, 0) << s.result.err;
  EXPECT_EQ(s.file->find("deepseek2.rope.scaling.yarn_log_multiplier"), nullptr);
  EXPECT_EQ(s.file->find("deepseek2.rope.scaling.type"), nullptr);
  const Synth y = synth("synth_ds2_yarn", "--preset deepseek2-tiny-yarn");
  ASSERT_EQ(y.result.exit_code, 0) << y.result.err;
  EXPECT_NEAR(key_float(*y.file, "rope.scaling.yarn_log_multiplier"), 0.1, 1e-7);
}

TEST(CliSynthDeepseek2, ErrorsNameTheFlagOrField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--preset deepseek2-tiny --kv-heads 2", "--kv-heads"},
      {"--preset deepseek2-tiny --head-dim 64", "--head-dim"},
      {"--preset deepseek2-tiny --mla-layout both", "--mla-layout 'both'"},
      {"--preset deepseek2-tiny-moe --expert-gating relu", "--expert-gating 'relu'"},
      {"--preset deepseek2-tiny-moe --experts-used 9", "num_experts_used = 9"},
      {"--preset deepseek2-tiny-moe --qk-rope-dim 15", "qk_rope_dim = 15"},
      {"--preset deepseek2-tiny-moe --expert-bias 1", "expert_bias"},
      {"--preset deepseek2-tiny-moe --experts -1", "--experts must be >= 0"},
      {"--preset deepseek2-tiny --yarn-log-multiplier 0.1", "yarn_log_multiplier"},
      {"--preset tiny-gqa --experts 4", "num_experts = 4 is a deepseek2 field"},
      {"--preset tiny-gqa --kv-lora-rank 32", "kv_lora_rank = 32 is a deepseek2 field"},
      {"--preset tiny-gqa --arch deepseek2", "kv_lora_rank"},
  };
  for (const auto& [flags, message] : cases) {
    const Synth s = synth("synth_ds2_errors", flags);
    EXPECT_NE(s.result.exit_code, 0) << flags;
    EXPECT_NE(s.result.err.find(message), std::string::npos) << flags << ": " << s.result.err;
  }
}

// A deepseek2 preset given another architecture keeps none of its MLA fields.
TEST(CliSynthDeepseek2, AnotherArchitectureDropsThePresetsMlaFields) {
  const Synth s = synth("synth_ds2_to_llama", "--preset deepseek2-tiny-moe --arch llama");
  ASSERT_EQ(s.result.exit_code, 0) << s.result.err;
  EXPECT_EQ(*s.file->get_string("general.architecture"), "llama");
  EXPECT_EQ(s.file->find("llama.expert_count"), nullptr);
}

TEST(CliSynthDeepseek2, HelpListsTheFlagsAndPresets) {
  const auto r = run_command(kvlm_binary() + " synth --help");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* flag : {"--q-lora-rank", "--kv-lora-rank", "--qk-nope-dim", "--qk-rope-dim", "--v-head-dim",
                           "--mla-layout", "--leading-dense-layers", "--experts", "--experts-used", "--shared-experts",
                           "--expert-ffn", "--expert-gating", "--expert-weights-norm", "--expert-weights-scale",
                           "--expert-bias", "--yarn-log-multiplier", "deepseek-v2-lite", "deepseek-v2-lite-attn",
                           "deepseek2-tiny-split", "deepseek2"}) {
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag;
  }
}

}  // namespace
}  // namespace kvlm
