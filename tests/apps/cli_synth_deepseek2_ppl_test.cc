// deepseek2 files written by `kvlm synth` against llama.cpp's own loader and forward
// (shared/anchors/llama.cpp/llama-perplexity): every tiny preset, in F32 and Q8_0 and in both MLA
// layouts (attn_kv_b as older converters write it, attn_k_b + attn_v_b as newer ones do), loads and
// gives a finite perplexity; and every optional key and tensor is read, not ignored. Skips with a
// message when the anchor is absent.
//
// Measured (4 windows of 128 tokens, seed 7): the two layouts of one F32 file agree to ~1e-7 relative
// (llama.cpp's two attention paths round differently); Q8_0 moves a file by 0.1-0.5%. That holds for
// the MoE presets because they route in 2 layers only: with 26 routed layers Q8_0 moved them by up to
// 15%, the few tokens whose top-k choice flips under quantization changing their outputs wholly.
#include <cmath>
#include <set>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "support/llama_perplexity.h"
#include "support/subprocess.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

namespace fs = std::filesystem;
using testing::kvlm_binary;
using testing::run_command;

constexpr int kWindows = 4;
constexpr int kContext = 128;  // past deepseek2-tiny-yarn's 64-token original context

// llama-perplexity's figure for a file `kvlm synth <flags> --seed 7` writes; NaN when either fails.
double llama_ppl(const std::string& label, const std::string& flags) {
  const auto perplexity = testing::llama_perplexity_binary();
  const auto text = testing::shared_file("tinystories_valid_head.txt");
  if (!perplexity || !text) return std::nan("");
  const fs::path dir = testing::scratch_dir("ds2_ppl_" + label);
  const std::string model = (dir / "model.gguf").string();
  const auto s = run_command(fmt::format("{} synth -o {} {} --seed 7", kvlm_binary(), model, flags));
  EXPECT_EQ(s.exit_code, 0) << s.err;
  EXPECT_EQ(s.err, "") << flags;  // no warning: a shape llama.cpp reads
  testing::LlamaPerplexityArgs args;
  args.binary = *perplexity;
  args.model = model;
  args.text = *text;
  args.context = kContext;
  args.num_windows = kWindows;
  const testing::LlamaPerplexityRun run = testing::run_llama_perplexity(args);
  EXPECT_EQ(run.exit_code, 0) << flags << "\n" << run.output;
  EXPECT_TRUE(run.ppl.has_value()) << flags << "\n" << run.output;
  return run.ppl.value_or(std::nan(""));
}

#define KVLM_REQUIRE_LLAMA_PERPLEXITY()                                                                     \
  if (!testing::llama_perplexity_binary())                                                                  \
    GTEST_SKIP() << "shared/anchors/llama.cpp/llama-perplexity not found (set KVLM_SHARED)";                \
  KVLM_REQUIRE_SHARED(text_file, "tinystories_valid_head.txt")

struct LayoutCase {
  std::string name;
  std::string flags;  // synth flags
};

void PrintTo(const LayoutCase& c, std::ostream* os) { *os << c.name; }

class Deepseek2LlamaPerplexity : public ::testing::TestWithParam<LayoutCase> {};

// In these cases llama.cpp reads the files; of kvlm only `synth` runs. Under ASan (~10x slower)
// the cases whose synth flags span the writer's paths run; Release runs every case.
#ifdef KVLM_SANITIZED_BUILD
#define KVLM_SANITIZED_RUN_ONLY(...)                                                           \
  if (const std::set<std::string> kept{__VA_ARGS__}; !kept.contains(GetParam().name))         \
  GTEST_SKIP() << "sanitized run: llama.cpp reads this file; Release runs the case"
#else
#define KVLM_SANITIZED_RUN_ONLY(...)
#endif

TEST_P(Deepseek2LlamaPerplexity, LoadsInBothLayoutsAndTypes) {
  KVLM_SANITIZED_RUN_ONLY("tiny_moe_sigmoid", "distinct_dims");
  KVLM_REQUIRE_LLAMA_PERPLEXITY();
  const LayoutCase& c = GetParam();
  double ppl[2][2];  // [f32, q8_0][kv_b, split]
  const char* kTypes[] = {"f32", "q8_0"};
  const char* kLayouts[] = {"kv_b", "split"};
  for (int t = 0; t < 2; ++t) {
    for (int l = 0; l < 2; ++l) {
      const std::string label = fmt::format("{}_{}_{}", c.name, kTypes[t], kLayouts[l]);
      ppl[t][l] = llama_ppl(label, fmt::format("{} --type {} --mla-layout {}", c.flags, kTypes[t], kLayouts[l]));
      // A random 512-token model: perplexity of the order of the vocabulary.
      EXPECT_TRUE(std::isfinite(ppl[t][l])) << label;
      EXPECT_GT(ppl[t][l], 100.0) << label;
      EXPECT_LT(ppl[t][l], 1e5) << label;
    }
  }
  // One model in two layouts (measured: ~1e-7 apart).
  EXPECT_LE(std::fabs(ppl[0][0] - ppl[0][1]) / ppl[0][0], 1e-5) << "kv_b " << ppl[0][0] << " split " << ppl[0][1];
  for (int l = 0; l < 2; ++l) {
    EXPECT_LE(std::fabs(ppl[1][l] - ppl[0][l]) / ppl[0][l], 0.02)
        << kLayouts[l] << ": f32 " << ppl[0][l] << " q8_0 " << ppl[1][l];
  }
}

// Every tiny preset; and, since the presets' kv_lora = nope = v = 32 make the split layout's
// key/value lengths (kv_lora + rope, kv_lora) equal the per-head ones (nope + rope, v), MLA dims
// that are all distinct, so a swapped key fails to load.
INSTANTIATE_TEST_SUITE_P(
    Presets, Deepseek2LlamaPerplexity,
    ::testing::Values(LayoutCase{"tiny", "--preset deepseek2-tiny"},
                      LayoutCase{"tiny_qlora", "--preset deepseek2-tiny-qlora"},
                      LayoutCase{"tiny_moe", "--preset deepseek2-tiny-moe"},
                      LayoutCase{"tiny_moe_sigmoid", "--preset deepseek2-tiny-moe-sigmoid"},
                      LayoutCase{"tiny_split", "--preset deepseek2-tiny-split"},
                      LayoutCase{"tiny_yarn", "--preset deepseek2-tiny-yarn"},
                      LayoutCase{"distinct_dims",
                                 "--preset deepseek2-tiny-qlora --kv-lora-rank 96 --qk-nope-dim 32 --qk-rope-dim 16 "
                                 "--v-head-dim 64"}),
    [](const auto& info) { return info.param.name; });

// llama.cpp ignores an optional key it does not know, so each one the files state must move its
// perplexity: a misspelt key or a wrong value type would leave it unchanged.
struct FeatureCase {
  std::string name;
  std::string with;     // synth flags
  std::string without;  // the same weights without the feature
};

void PrintTo(const FeatureCase& c, std::ostream* os) { *os << c.name; }

class Deepseek2FeatureIsRead : public ::testing::TestWithParam<FeatureCase> {};

TEST_P(Deepseek2FeatureIsRead, MovesLlamaPerplexity) {
  KVLM_SANITIZED_RUN_ONLY("yarn_log_multiplier", "exp_probs_b");
  KVLM_REQUIRE_LLAMA_PERPLEXITY();
  const FeatureCase& c = GetParam();
  const double with = llama_ppl(c.name + "_with", c.with);
  const double without = llama_ppl(c.name + "_without", c.without);
  ASSERT_TRUE(std::isfinite(with) && std::isfinite(without)) << with << " " << without;
  EXPECT_GT(std::fabs(with - without) / without, 1e-3) << "with " << with << " without " << without;
}

INSTANTIATE_TEST_SUITE_P(
    Keys, Deepseek2FeatureIsRead,
    ::testing::Values(
        FeatureCase{"yarn", "--preset deepseek2-tiny-yarn --yarn-log-multiplier 0", "--preset deepseek2-tiny-qlora"},
        FeatureCase{"yarn_log_multiplier", "--preset deepseek2-tiny-yarn",
                    "--preset deepseek2-tiny-yarn --yarn-log-multiplier 0"},
        FeatureCase{"expert_weights_norm", "--preset deepseek2-tiny-moe --expert-weights-norm 1",
                    "--preset deepseek2-tiny-moe"},
        FeatureCase{"expert_weights_scale", "--preset deepseek2-tiny-moe --expert-weights-scale 2",
                    "--preset deepseek2-tiny-moe"},
        FeatureCase{"expert_gating_func", "--preset deepseek2-tiny-moe --expert-gating sigmoid",
                    "--preset deepseek2-tiny-moe"},
        FeatureCase{"exp_probs_b", "--preset deepseek2-tiny-moe-sigmoid",
                    "--preset deepseek2-tiny-moe-sigmoid --expert-bias 0"}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace kvlm
