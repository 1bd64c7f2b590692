// Files of each architecture and RoPE rule kvlm reads, written by `kvlm synth` with F32 weights,
// against llama.cpp's llama-perplexity (shared/anchors/llama.cpp) on the same file, text and
// windows: a wrong norm, scale, RoPE base or factor moves perplexity by far more than the 1e-4
// relative allowed. llama-perplexity runs with an f32 cache and flash attention off: its CPU
// flash-attention path rounds queries to f16, which alone moves these figures by ~7e-5;
// without it the two engines agree to ~2e-7. Skips with a message when the anchor is absent.
#include <cmath>
#include <cstdio>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/llama_perplexity.h"
#include "support/subprocess.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

namespace fs = std::filesystem;
using testing::kvlm_binary;
using testing::run_command;

constexpr int kWindows = 8;
constexpr int kContext = 128;

struct ArchCase {
  std::string name;
  std::string synth_flags;
  double tolerance = 1e-4;  // relative; F32 weights
  // Q8_0 files: the engines quantize activations at different points (kvlm's absorbed MLA multiplies
  // the query by W_UK_hᵀ in f32), and a perplexity on one text moves by ~0.1% with any last-bit
  // change, so they are compared over 8k tokens.
  int windows = kWindows;
  std::string eval_flags{};  // added to kvlm eval ppl's
};

void PrintTo(const ArchCase& c, std::ostream* os) { *os << c.name; }

struct Figures {
  double kvlm = 0;
  double llama = 0;
};

// Synthesizes the case's file and measures both engines on it.
Figures measure(const ArchCase& c, const fs::path& perplexity, const fs::path& text) {
  const fs::path dir = testing::scratch_dir("arch_ppl_" + c.name);
  const std::string model = (dir / "model.gguf").string();
  const auto s = run_command(kvlm_binary() + " synth -o " + model + " " + c.synth_flags + " --seed 7");
  EXPECT_EQ(s.exit_code, 0) << s.err;
  Figures f;
  const auto k = run_command(fmt::format("{} eval ppl -m {} -f {} -c {} --max-chunks {} --json {}", kvlm_binary(),
                                         model, text.string(), kContext, c.windows, c.eval_flags));
  EXPECT_EQ(k.exit_code, 0) << k.err;
  if (k.exit_code == 0) f.kvlm = nlohmann::json::parse(k.out).at("ppl").get<double>();
  testing::LlamaPerplexityArgs args;
  args.binary = perplexity;
  args.model = model;
  args.text = text;
  args.context = kContext;
  args.num_windows = c.windows;
  const testing::LlamaPerplexityRun l = testing::run_llama_perplexity(args);
  EXPECT_EQ(l.exit_code, 0) << l.output;
  EXPECT_TRUE(l.ppl.has_value()) << l.output;
  if (l.ppl) f.llama = *l.ppl;
  return f;
}

class ArchitecturePerplexity : public ::testing::TestWithParam<ArchCase> {};

TEST_P(ArchitecturePerplexity, MatchesLlamaPerplexity) {
#ifdef KVLM_SANITIZED_BUILD
  // The 32k-token agreement cases are statistics, ~50 s each under ASan: the sanitized run reaches
  // their code through CombinedKvBQ8_0IsAsCloseToF32AsLlamaCpp (the combined files, sigmoid gating)
  // and deepseek2_split_q8_0 (the split layout), 8k tokens each.
  if (GetParam().windows > 64) GTEST_SKIP() << "32k-token agreement: run in the Release suite";
  // Variants whose code the sanitized run reaches through a sibling case: linear scaling
  // (gemma3_linear), Gemma 3's window, period and local base (gemma3_window5, gemma3_mqa_7_layers),
  // and plain deepseek2 (deepseek2_qlora, deepseek2_split). The split Q8_0 file with sigmoid gating
  // runs 32k tokens (skipped above); deepseek2_split_q8_0 runs its split Q8_0 code here (~18 s).
  const std::set<std::string> covered_by_siblings = {"linear", "gemma3", "gemma3_period3", "gemma3_local_base",
                                                     "deepseek2"};
  if (covered_by_siblings.contains(GetParam().name)) {
    GTEST_SKIP() << "sanitized run: a sibling case runs the same code; Release runs this one";
  }
#endif
  const auto perplexity = testing::shared_anchor("llama.cpp/llama-perplexity");
  if (!perplexity) GTEST_SKIP() << "shared/anchors/llama.cpp/llama-perplexity not found (set KVLM_SHARED)";
  KVLM_REQUIRE_SHARED(text, "tinystories_valid_head.txt");
  const Figures f = measure(GetParam(), *perplexity, text);
  ASSERT_GT(f.llama, 0.0);
  EXPECT_LE(std::fabs(f.kvlm - f.llama) / f.llama, GetParam().tolerance)
      << "kvlm " << f.kvlm << " llama.cpp " << f.llama;
}

// Past the 64-token original context the scaled files state, so every rule is exercised.
// gemma3 agrees less closely (measured 2e-5 to 8e-5): llama.cpp's CPU GELU reads a table of f16
// inputs and outputs; kvlm computing GELU through the same f16 rounding agreed to 6e-6 (once, by hand).
const std::string kBase = "--preset tiny-gqa --head-dim 32 --vocab 512";
INSTANTIATE_TEST_SUITE_P(
    Files, ArchitecturePerplexity,
    ::testing::Values(ArchCase{"llama", kBase},
                      ArchCase{"llama3_rope_freqs", kBase + " --rope-scaling llama3 --rope-factor 8 --rope-orig-ctx 64"},
                      ArchCase{"yarn", kBase + " --rope-scaling yarn --rope-factor 4 --rope-orig-ctx 64"},
                      ArchCase{"linear", kBase + " --rope-scaling linear --rope-factor 4"},
                      ArchCase{"qwen3", "--preset qwen3-tiny"},
                      // Gemma 3: local layers (window 24 < the 128-token context; default period 6), a
                      // window that cuts hard, a period written in the file, the local layers' own
                      // RoPE base, linear scaling of the global layers only (as 4B+ files state), MQA.
                      ArchCase{"gemma3", "--preset gemma3-tiny"},
                      ArchCase{"gemma3_window5", "--preset gemma3-tiny --sliding-window 5"},
                      ArchCase{"gemma3_period3", "--preset gemma3-tiny --swa-period 3"},
                      ArchCase{"gemma3_local_base", "--preset gemma3-tiny --rope-base-swa 500"},
                      ArchCase{"gemma3_linear", "--preset gemma3-tiny --rope-scaling linear --rope-factor 8"},
                      ArchCase{"gemma3_mqa_7_layers", "--preset gemma3-tiny --layers 7 --kv-heads 1 --swa-period 4"},
                      // phi3: fused q/k/v and gate/up; a stated window that neither engine applies.
                      ArchCase{"phi3", "--preset phi3-tiny"},
                      ArchCase{"phi3_gqa_window", "--preset phi3-tiny --kv-heads 2 --sliding-window 5"},
                      // deepseek2: MLA over the latent cache (plain attn_q and the q bottleneck, attn_kv_b
                      // and the split attn_k_b/attn_v_b), dense and MoE FFNs with softmax and sigmoid
                      // gating (bias, renormalised, scaled), YaRN with DeepSeek's mscale; Q8_0 to 0.15%.
                      ArchCase{"deepseek2", "--preset deepseek2-tiny"},
                      ArchCase{"deepseek2_qlora", "--preset deepseek2-tiny-qlora"},
                      ArchCase{"deepseek2_moe", "--preset deepseek2-tiny-moe"},
                      ArchCase{"deepseek2_moe_sigmoid", "--preset deepseek2-tiny-moe-sigmoid"},
                      ArchCase{"deepseek2_split", "--preset deepseek2-tiny-split"},
                      ArchCase{"deepseek2_yarn", "--preset deepseek2-tiny-yarn"},
                      ArchCase{"deepseek2_split_q8_0", "--preset deepseek2-tiny-split --type q8_0", 1.5e-3, 64},
                      // Sigmoid-gated MoE over 8k tokens is as sensitive as the combined cases below: there
                      // llama.cpp's haswell and zen4 variants were 0.10% apart (3831.66 / 3827.69) and
                      // kvlm's avx2 and avx512 paths 0.17% (3823.03 / 3829.41), so kvlm avx2 against
                      // llama.cpp haswell (an AVX2-only CPU) was 0.225% apart, while every path's KLD from
                      // the F32 file agreed within one standard error (6.0e-3 to 7.0e-3 +/- 4.5e-4). Over
                      // 32k tokens the four were within 0.1% (3496.01 to 3499.35).
                      ArchCase{"deepseek2_split_sigmoid_q8_0",
                               "--preset deepseek2-tiny-moe-sigmoid --mla-layout split --type q8_0", 1.5e-3, 256},
                      // The combined attn_kv_b: see CombinedKvBQ8_0IsAsCloseToF32AsLlamaCpp for why 32k tokens.
                      ArchCase{"deepseek2_kv_b_q8_0", "--preset deepseek2-tiny-moe --type q8_0", 1.5e-3, 256},
                      ArchCase{"deepseek2_kv_b_sigmoid_q8_0", "--preset deepseek2-tiny-moe-sigmoid --type q8_0", 1.5e-3,
                               256}),
    [](const auto& info) { return info.param.name; });

// Q8_0 files with the combined attn_kv_b: llama.cpp expands keys and values from the latent through
// the quantized matrix (quantizing the latent as its input), kvlm folds W_UK_h into the query in
// f32 and applies W_UV_h to the attention's mix. Their rounding differs, and on these random tiny
// MoE models a perplexity over 8k tokens moves by ~0.1% with any last-bit change (a different
// prefill chunk alone moved kvlm's by 0.03-0.08%): over 8k tokens the two were 0.16% / 0.32%
// apart (softmax / sigmoid), over 32k 0.02% / 0.08%, over the whole 586k-token text 0.06%
// (sigmoid: kvlm 3382.37, llama.cpp 3380.40, F32 3389.60). So the agreement cases above run 32k
// tokens; this one checks that kvlm's absorbed form is at least as close to the F32 weights as
// llama.cpp's expanded one, by the per-token KL divergence from the F32 file's distribution (each
// engine against its own F32 run; llama-perplexity --kl-divergence), within two standard errors
// of the two means. (It compared perplexity distances until the AMX kernels: the perplexity of
// these random models follows the weights' quantization more than the arithmetic, so a kernel
// twice as close by KLD, 5.3e-4 against 1.1e-3, measured 3.0e-3 from F32 against 1.5e-3.)
struct KvlmKld {
  double ppl = 0;
  double mean = 0;
  double stderr_of_mean = 0;
  double top1 = 0;
};

KvlmKld kvlm_eval(const std::string& model, const fs::path& text, int windows, const std::string& kld_flags) {
  const auto r = run_command(fmt::format("{} eval ppl -m {} -f {} -c {} --max-chunks {} --json {}", kvlm_binary(), model,
                                         text.string(), kContext, windows, kld_flags));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  KvlmKld k;
  if (r.exit_code != 0) return k;
  const auto j = nlohmann::json::parse(r.out);
  k.ppl = j.at("ppl").get<double>();
  if (j.contains("kld")) {
    k.mean = j["kld"].at("mean_kld").get<double>();
    k.stderr_of_mean = j["kld"].at("kld_stderr").get<double>();
    k.top1 = j["kld"].at("top1_agreement").get<double>();
  }
  return k;
}

TEST(ArchitecturePerplexityDeepseek2, CombinedKvBQ8_0IsAsCloseToF32AsLlamaCpp) {
  const auto perplexity = testing::shared_anchor("llama.cpp/llama-perplexity");
  if (!perplexity) GTEST_SKIP() << "shared/anchors/llama.cpp/llama-perplexity not found (set KVLM_SHARED)";
  KVLM_REQUIRE_SHARED(text, "tinystories_valid_head.txt");
  constexpr int kWindows8k = 64;
#ifdef KVLM_SANITIZED_BUILD
  // ~35 s per preset under ASan: the sanitized run takes the sigmoid preset only (the softmax
  // one's code runs under ASan in the deepseek2_moe agreement case above); Release runs both.
  const std::vector<std::string> presets = {"deepseek2-tiny-moe-sigmoid"};
#else
  const std::vector<std::string> presets = {"deepseek2-tiny-moe", "deepseek2-tiny-moe-sigmoid"};
#endif
  for (const std::string& preset : presets) {
    SCOPED_TRACE(preset);
    const fs::path dir = testing::scratch_dir("arch_kld_" + preset);
    const std::string f32 = (dir / "f32.gguf").string();
    const std::string q8 = (dir / "q8_0.gguf").string();
    for (const auto& [file, type] : {std::pair{f32, std::string("f32")}, std::pair{q8, std::string("q8_0")}}) {
      const auto s = run_command(kvlm_binary() + " synth -o " + file + " --preset " + preset + " --type " + type +
                                 " --seed 7");
      ASSERT_EQ(s.exit_code, 0) << s.err;
    }
    const std::string kvlm_base = (dir / "kvlm_f32.kld").string();
    const std::string llama_base = (dir / "llama_f32.kld").string();
    const KvlmKld kvlm_f32 = kvlm_eval(f32, text, kWindows8k, "--kld-base " + kvlm_base);
    const KvlmKld kvlm_q8 = kvlm_eval(q8, text, kWindows8k, "--kld-other-model --kld " + kvlm_base);

    testing::LlamaPerplexityArgs args;
    args.binary = *perplexity;
    args.text = text;
    args.context = kContext;
    args.num_windows = kWindows8k;
    args.model = f32;
    args.extra_flags = "--kl-divergence-base " + llama_base;
    const testing::LlamaPerplexityRun llama_f32 = testing::run_llama_perplexity(args);
    ASSERT_EQ(llama_f32.exit_code, 0) << llama_f32.output;
    ASSERT_TRUE(llama_f32.ppl.has_value()) << llama_f32.output;
    args.model = q8;
    args.extra_flags = "--kl-divergence-base " + llama_base + " --kl-divergence";
    args.expect_kld = true;
    const testing::LlamaPerplexityRun llama_q8 = testing::run_llama_perplexity(args);
    ASSERT_EQ(llama_q8.exit_code, 0) << llama_q8.output;
    ASSERT_TRUE(llama_q8.kld.has_value()) << llama_q8.output;

    EXPECT_LE(std::fabs(kvlm_f32.ppl - *llama_f32.ppl) / *llama_f32.ppl, 1e-4);
    ASSERT_GT(kvlm_q8.mean, 0.0);  // a Q8_0 file is not its F32 original
    const double allowance = 2.0 * std::hypot(kvlm_q8.stderr_of_mean, llama_q8.kld->stderr_of_mean);
    EXPECT_LE(kvlm_q8.mean, llama_q8.kld->mean + allowance)
        << "KLD from F32: kvlm " << kvlm_q8.mean << " +/- " << kvlm_q8.stderr_of_mean << " (top-1 "
        << 100 * kvlm_q8.top1 << "%), llama.cpp " << llama_q8.kld->mean << " +/- " << llama_q8.kld->stderr_of_mean
        << " (top-1 " << llama_q8.kld->same_top_percent << "%)";
    std::printf("%s: KLD from F32 over 8k tokens: kvlm %.3g +/- %.2g (top-1 %.2f%%), llama.cpp %.3g +/- %.2g "
                "(top-1 %.2f%%)\n",
                preset.c_str(), kvlm_q8.mean, kvlm_q8.stderr_of_mean, 100 * kvlm_q8.top1, llama_q8.kld->mean,
                llama_q8.kld->stderr_of_mean, llama_q8.kld->same_top_percent);
  }
}

// Today's silent error, fixed: a model with rope_freqs.weight gives llama.cpp's perplexity, not
// the perplexity of the same weights without the tensor.
TEST(ArchitecturePerplexityFreqs, FrequencyFactorsAreNotIgnored) {
  const auto perplexity = testing::shared_anchor("llama.cpp/llama-perplexity");
  if (!perplexity) GTEST_SKIP() << "shared/anchors/llama.cpp/llama-perplexity not found (set KVLM_SHARED)";
  KVLM_REQUIRE_SHARED(text, "tinystories_valid_head.txt");
  const Figures with = measure({"freqs_on", kBase + " --rope-scaling llama3 --rope-factor 8 --rope-orig-ctx 64"},
                               *perplexity, text);
  const Figures without = measure({"freqs_off", kBase}, *perplexity, text);
  EXPECT_LE(std::fabs(with.kvlm - with.llama) / with.llama, 1e-4);
  // The factors move perplexity by percent, a hundred times the agreement above.
  EXPECT_GT(std::fabs(with.kvlm - without.kvlm) / without.kvlm, 1e-2)
      << "with " << with.kvlm << " without " << without.kvlm;
}

}  // namespace
}  // namespace kvlm
