// Files of each architecture and RoPE rule kvlm reads, written by `kvlm synth` with F32 weights,
// against llama.cpp's llama-perplexity (shared/anchors/llama.cpp) on the same file, text and
// windows: a wrong norm, scale, RoPE base or factor moves perplexity by far more than the 1e-4
// relative allowed. llama-perplexity runs with an f32 cache and flash attention off: its CPU
// flash-attention path rounds queries to f16, which alone moves these figures by ~7e-5;
// without it the two engines agree to ~2e-7. Skips with a message when the anchor is absent.
#include <cmath>
#include <regex>
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

struct ArchCase {
  std::string name;
  std::string synth_flags;
};

void PrintTo(const ArchCase& c, std::ostream* os) { *os << c.name; }

// The running perplexity after `num_windows` windows ("[8]4194.3138,"): llama-perplexity runs
// two windows more than that, since its last log lines are the ones an exit may lose.
std::optional<double> llama_ppl(const std::string& output, int num_windows) {
  std::smatch m;
  const std::regex window("\\[" + std::to_string(num_windows) + R"(\]([0-9.]+))");
  if (std::regex_search(output, m, window)) return std::stod(m[1].str());
  return std::nullopt;
}

constexpr int kWindows = 8;
constexpr int kContext = 128;

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
  const auto k = run_command(fmt::format("{} eval ppl -m {} -f {} -c {} --max-chunks {} --json", kvlm_binary(), model,
                                         text.string(), kContext, kWindows));
  EXPECT_EQ(k.exit_code, 0) << k.err;
  if (k.exit_code == 0) f.kvlm = nlohmann::json::parse(k.out).at("ppl").get<double>();
  // llama.cpp logs from a thread of its own that exit may cut short (under load, most runs lose
  // their last lines though they exit 0): two extra windows, and the figure is deterministic, so
  // run again when even that was lost.
  std::optional<double> ppl;
  testing::CommandResult l;
  for (int attempt = 0; attempt < 4 && !ppl; ++attempt) {
    l = run_command(fmt::format("LD_LIBRARY_PATH={} {} -m {} -f {} -c {} --chunks {} -t 2 -ctk f32 -ctv f32 -fa off",
                                perplexity.parent_path().string(), perplexity.string(), model, text.string(), kContext,
                                kWindows + 2));
    EXPECT_EQ(l.exit_code, 0) << l.err;
    ppl = llama_ppl(l.out + l.err, kWindows);
  }
  EXPECT_TRUE(ppl.has_value()) << l.out << l.err;
  if (ppl) f.llama = *ppl;
  return f;
}

class ArchitecturePerplexity : public ::testing::TestWithParam<ArchCase> {};

TEST_P(ArchitecturePerplexity, MatchesLlamaPerplexity) {
  const auto perplexity = testing::shared_anchor("llama.cpp/llama-perplexity");
  if (!perplexity) GTEST_SKIP() << "shared/anchors/llama.cpp/llama-perplexity not found (set KVLM_SHARED)";
  KVLM_REQUIRE_SHARED(text, "tinystories_valid_head.txt");
  const Figures f = measure(GetParam(), *perplexity, text);
  ASSERT_GT(f.llama, 0.0);
  EXPECT_LE(std::fabs(f.kvlm - f.llama) / f.llama, 1e-4) << "kvlm " << f.kvlm << " llama.cpp " << f.llama;
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
                      ArchCase{"phi3_gqa_window", "--preset phi3-tiny --kv-heads 2 --sliding-window 5"}),
    [](const auto& info) { return info.param.name; });

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
