// RoPE as the files say (Llama 3.x frequency factors from the tensor or from metadata, YaRN,
// linear) and qwen3's per-head q/k norms: the cached forward against the no-cache reference,
// which implements each rule itself; and the config reader's errors for what it cannot run.
#include <cmath>
#include <functional>
#include <numbers>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "engine/generator.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "model/llama_model.h"
#include "model/model_synthesizer.h"
#include "model/rope_scaling.h"
#include "reference/reference_forward.h"
#include "support/gguf_rewrite.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

// F32 cache: only float-vs-double arithmetic differs from the reference.
constexpr double kF32Tolerance = 1e-4;

SynthShape shape_named(const std::string& variant) {
  SynthShape s = *synth_preset("tiny-gqa");
  s.head_dim = 32;  // 16 rotated pairs: YaRN's ramp and Llama 3's blend each cover several
  if (variant == "qwen3") return *synth_preset("qwen3-tiny");
  if (variant == "phi3") return *synth_preset("phi3-tiny");
  if (variant == "phi3-gqa") {
    SynthShape p = *synth_preset("phi3-tiny");
    p.num_kv_heads = 2;
    return p;
  }
  if (variant == "llama3") s.rope_scaling = {"llama3", 8.0f, 64, 1.0f, 4.0f};
  if (variant == "llama3-metadata") s.rope_scaling = {"llama3-metadata", 8.0f, 64, 1.0f, 4.0f};
  if (variant == "yarn") s.rope_scaling = {"yarn", 4.0f, 64, 1.0f, 4.0f};
  if (variant == "linear") s.rope_scaling = {"linear", 4.0f, 0, 1.0f, 4.0f};
  return s;
}

std::string synth_file(const std::string& variant) {
  const auto dir = testing::scratch_dir("rope_arch_" + variant);
  SynthOptions options;
  options.shape = shape_named(variant);
  options.seed = 5;
  options.out_path = (dir / (variant + ".gguf")).string();
  const Status s = synthesize_model(options);
  EXPECT_TRUE(s.ok()) << s.message();
  return options.out_path;
}

using Case = std::tuple<std::string, int>;  // variant, block size

class RopeArchitectureForwardTest : public ::testing::TestWithParam<Case> {};

TEST_P(RopeArchitectureForwardTest, EveryStepMatchesReference) {
  const auto& [variant, block_size] = GetParam();
  auto model = LlamaModel::load(synth_file(variant));
  ASSERT_TRUE(model.ok()) << model.status().message();
  ThreadPool pool(2);
  Generator generator(**model, pool);
  GenerationOptions options;
  options.max_tokens = 100;  // past the 64-token original context the scaled files state
  options.sampler.temperature = 0;
  options.block_size = block_size;
  options.prefill_chunk = 5;
  options.verify = true;
  options.stop_at_eos = false;
  const std::vector<TokenId> prompt{1, 300, 17, 42, 99, 123, 7, 260, 261, 5, 77, 88};
  auto r = generator.generate(prompt, options, {});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->tokens.size(), 112u);
  EXPECT_LE(r->stats.verify_max_rel_error, kF32Tolerance) << variant;
  EXPECT_EQ(r->stats.blocks_leaked, 0);
}

INSTANTIATE_TEST_SUITE_P(Variants, RopeArchitectureForwardTest,
                         ::testing::Combine(::testing::Values("qwen3", "phi3", "phi3-gqa", "llama3", "llama3-metadata", "yarn",
                                                              "linear"),
                                            ::testing::Values(1, 16)),
                         [](const auto& info) {
                           std::string name = std::get<0>(info.param) + "_block" + std::to_string(std::get<1>(info.param));
                           for (char& ch : name) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return name;
                         });

TEST(RopeScaling, ConfigReadsWhatTheFileStates) {
  auto qwen3 = LlamaModel::load(synth_file("qwen3"));
  ASSERT_TRUE(qwen3.ok()) << qwen3.status().message();
  EXPECT_TRUE((*qwen3)->config().has_qk_norm);
  EXPECT_EQ((*qwen3)->config().rope.style, RopeStyle::kNeox);
  EXPECT_EQ((*qwen3)->weights().layers[0].q_norm.size(), 32u);

  auto tensor = LlamaModel::load(synth_file("llama3"));
  auto metadata = LlamaModel::load(synth_file("llama3-metadata"));
  ASSERT_TRUE(tensor.ok() && metadata.ok());
  EXPECT_EQ((*tensor)->config().rope_scaling, RopeScalingKind::kLlama3);
  EXPECT_EQ((*metadata)->config().rope_scaling, RopeScalingKind::kLlama3);
  // The tensor the synthesizer wrote and the factors computed from metadata are the same numbers.
  EXPECT_EQ((*tensor)->config().rope.freq_factors, (*metadata)->config().rope.freq_factors);

  auto yarn = LlamaModel::load(synth_file("yarn"));
  ASSERT_TRUE(yarn.ok());
  const RopeParams& y = (*yarn)->config().rope;
  EXPECT_EQ((*yarn)->config().rope_scaling, RopeScalingKind::kYarn);
  EXPECT_FLOAT_EQ(y.freq_scale, 0.25f);
  EXPECT_EQ(y.yarn.ext_factor, 1.0f);
  EXPECT_EQ(y.yarn.original_context, 64);
  // YaRN's attention correction: 1 + 0.1 ln(4).
  EXPECT_NEAR(rope_magnitude(y), 1.0 + 0.1 * std::log(4.0), 1e-12);
}

// Llama 3.1's published rope_scaling (factor 8, low 1, high 4, original context 8192, base 500000,
// head_dim 128): pairs whose wavelength 2π / f is under 8192 / 4 = 2048 keep their frequency,
// over 8192 are slowed 8×, between is the blend, so factors rise monotonically from 1 to 8.
TEST(RopeScaling, Llama3FactorsFollowTheWavelengthBands) {
  const std::vector<float> f = llama3_frequency_factors(128, 500000.0, 8.0, 1.0, 4.0, 8192.0);
  ASSERT_EQ(f.size(), 64u);
  int ones = 0, eights = 0;
  for (int i = 0; i < 64; ++i) {
    const double wavelength = 2.0 * std::numbers::pi * std::pow(500000.0, 2.0 * i / 128);
    if (wavelength < 2048) {
      EXPECT_EQ(f[i], 1.0f) << i;
      ++ones;
    } else if (wavelength > 8192) {
      EXPECT_EQ(f[i], 8.0f) << i;
      ++eights;
    } else {
      EXPECT_GT(f[i], 1.0f);
      EXPECT_LT(f[i], 8.0f);
      // The blend is linear in 8192 / wavelength between 1 and 4: 1/factor = (1 - s)/8 + s.
      const double s = (8192.0 / wavelength - 1.0) / 3.0;
      EXPECT_NEAR(1.0 / f[i], (1.0 - s) / 8.0 + s, 1e-6) << i;
    }
    if (i > 0) {
      EXPECT_GE(f[i], f[i - 1]);
    }
  }
  EXPECT_GT(ones, 0);
  EXPECT_GT(eights, 0);
}

// The same weights with and without rope_freqs give different logits past the first token
// (every pair but the fastest is slowed), and each matches the reference given its own factors.
TEST(RopeScaling, FrequencyFactorsChangeTheModel) {
  auto with = LlamaModel::load(synth_file("llama3"));
  auto without = LlamaModel::load(synth_file("none"));
  ASSERT_TRUE(with.ok() && without.ok());
  const std::vector<TokenId> tokens{1, 300, 17, 42, 99, 123, 7, 260, 261, 5, 77, 88, 13, 14, 15, 16};
  const std::vector<double> a = reference_logits((*with)->config(), (*with)->weights(), tokens);
  const std::vector<double> b = reference_logits((*without)->config(), (*without)->weights(), tokens);
  const size_t vocab = static_cast<size_t>((*with)->config().vocab_size);
  double first_row = 0, last_row = 0;
  for (size_t i = 0; i < vocab; ++i) {
    first_row = std::max(first_row, std::fabs(a[i] - b[i]));
    last_row = std::max(last_row, std::fabs(a[a.size() - vocab + i] - b[b.size() - vocab + i]));
  }
  EXPECT_LT(first_row, 1e-9);  // position 0 rotates by nothing
  EXPECT_GT(last_row, 1e-3);
}

// A file rewritten with one metadata change.
std::string with_metadata(const std::string& variant, const std::function<void(GgufWriter&)>& edit) {
  const std::string src = synth_file(variant);
  return testing::rewrite_gguf_metadata(src, src + ".edited.gguf", edit);
}

// phi3: q/k/v and gate/up read as row views of the fused tensors; the window its files state
// is not applied (as llama.cpp does not), which the config says in a warning.
TEST(Phi3Config, FusedTensorsWindowWarningAndLongRopeError) {
  auto m = LlamaModel::load(synth_file("phi3-gqa"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  const ModelConfig& c = (*m)->config();
  EXPECT_TRUE(c.fused_qkv);
  EXPECT_TRUE(c.fused_gate_up);
  EXPECT_EQ(c.rope.style, RopeStyle::kNeox);
  const LlamaLayerWeights& l = (*m)->weights().layers[1];
  EXPECT_EQ(l.wq.rows, 64);
  EXPECT_EQ(l.wk.rows, 32);
  EXPECT_EQ(l.wv.data, l.wk.data + 32 * l.wk.row_bytes);  // views into one tensor, in q, k, v order
  EXPECT_EQ(l.w_up.data, l.w_gate.data + 128 * l.w_gate.row_bytes);
  EXPECT_TRUE(c.warnings.empty());
  const std::string src = synth_file("phi3");
  auto windowed = LlamaModel::load(testing::rewrite_gguf_metadata(
      src, src + ".window.gguf", [](GgufWriter& w) { w.set_u32("phi3.attention.sliding_window", 2047); }));
  ASSERT_TRUE(windowed.ok()) << windowed.status().message();
  EXPECT_FALSE((*windowed)->config().sliding_window.any());
  ASSERT_EQ((*windowed)->config().warnings.size(), 1u);
  EXPECT_NE((*windowed)->config().warnings[0].find("'phi3.attention.sliding_window' = 2047 is not applied"),
            std::string::npos);
  auto longrope = LlamaModel::load(testing::rewrite_gguf_metadata(src, src + ".longrope.gguf", [](GgufWriter& w) {
    w.add_tensor("rope_factors_long.weight", GgmlType::kF32, {8}, std::vector<uint8_t>(32, 0));
  }));
  ASSERT_FALSE(longrope.ok());
  EXPECT_NE(longrope.status().message().find("phi3 LongRoPE"), std::string::npos) << longrope.status().message();
}

TEST(RopeScaling, WhatKvlmCannotRunIsAnErrorNamingIt) {
  auto expect_error = [](const std::string& path, const std::string& needle) {
    auto m = LlamaModel::load(path);
    ASSERT_FALSE(m.ok()) << path;
    EXPECT_NE(m.status().message().find(needle), std::string::npos) << m.status().message();
  };
  expect_error(with_metadata("none", [](GgufWriter& w) { w.set_string("llama.rope.scaling.type", "longrope"); }),
               "rope scaling type 'longrope'");
  expect_error(with_metadata("none",
                             [](GgufWriter& w) {
                               w.set_string("llama.rope.scaling.type", "yarn");
                               w.set_f32("llama.rope.scaling.factor", 4.0f);
                             }),
               "rope.scaling.original_context_length");
  expect_error(with_metadata("none",
                             [](GgufWriter& w) {
                               w.set_string("llama.rope.scaling.type", "linear");
                               w.set_f32("llama.rope.scaling.factor", -2.0f);
                             }),
               "must be positive");
  expect_error(with_metadata("none",
                             [](GgufWriter& w) {
                               w.set_string("llama.rope.scaling.type", "llama3");
                               w.set_f32("llama.rope.scaling.factor", 8.0f);
                             }),
               "rope.scaling.original_context_length");
  expect_error(with_metadata("none",
                             [](GgufWriter& w) {
                               w.set_string("llama.rope.scaling.type", "none");
                               w.set_f32("llama.rope.scaling.factor", 8.0f);
                             }),
               "which one is meant");
  expect_error(with_metadata("none", [](GgufWriter& w) { w.set_string("llama.rope.scaling.type", "linear"); }),
               "needs metadata 'llama.rope.scaling.factor'");
}

}  // namespace
}  // namespace kvlm
