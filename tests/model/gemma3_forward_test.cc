// Gemma 3: the cached forward (scaled embedding, q/k norms, post-norms, GELU, local layers with
// their window and RoPE base) against the no-cache reference, which applies each rule itself;
// what the config reads from a file; and the errors for files kvlm cannot run as stated.
#include <cmath>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "engine/generator.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "model/llama_model.h"
#include "model/model_synthesizer.h"
#include "reference/reference_forward.h"
#include "support/gguf_rewrite.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

// F32 cache: only float-vs-double arithmetic differs from the reference.
constexpr double kF32Tolerance = 1e-4;

SynthShape shape_named(const std::string& variant) {
  SynthShape s = *synth_preset("gemma3-tiny");  // 6 layers, window 24, layer 5 global
  if (variant == "window5") s.sliding_window = 5;
  if (variant == "period3") s.sliding_window_period = 3;
  if (variant == "local_base") s.rope_freq_base_swa = 500.0f;
  if (variant == "linear") s.rope_scaling = {"linear", 8.0f, 0, 1.0f, 4.0f};
  if (variant == "mqa7") {
    s.num_layers = 7;
    s.num_kv_heads = 1;
    s.sliding_window_period = 4;
  }
  if (variant == "layers62") s.num_layers = 62;  // the 27B rule for the attention scale
  if (variant == "wide_window") s.sliding_window = 4096;  // never cuts below 4,096 tokens
  return s;
}

std::string synth_file(const std::string& variant) {
  const auto dir = testing::scratch_dir("gemma3_" + variant);
  SynthOptions options;
  options.shape = shape_named(variant);
  options.seed = 5;
  options.out_path = (dir / (variant + ".gguf")).string();
  const Status s = synthesize_model(options);
  EXPECT_TRUE(s.ok()) << s.message();
  return options.out_path;
}

using Case = std::tuple<std::string, int, int>;  // variant, block size, prefill chunk

class Gemma3ForwardTest : public ::testing::TestWithParam<Case> {};

TEST_P(Gemma3ForwardTest, EveryStepMatchesReference) {
  const auto& [variant, block_size, chunk] = GetParam();
  auto model = LlamaModel::load(synth_file(variant));
  ASSERT_TRUE(model.ok()) << model.status().message();
  ThreadPool pool(2);
  Generator generator(**model, pool);
  GenerationOptions options;
  options.max_tokens = 88;  // 100 tokens: four windows of 24
  options.sampler.temperature = 0;
  options.block_size = block_size;
  options.prefill_chunk = chunk;
  options.verify = true;
  options.stop_at_eos = false;
  std::vector<TokenId> prompt{1, 300, 17, 42, 99, 123, 7, 260, 261, 5, 77, 88};
  if (chunk > 12) {  // a prompt longer than the window, computed in one step
    for (int i = 0; i < 40; ++i) prompt.push_back(static_cast<TokenId>(3 + (i * 37) % 500));
    options.max_tokens = 48;
  }
  auto r = generator.generate(prompt, options, {});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->tokens.size(), 100u);
  EXPECT_LE(r->stats.verify_max_rel_error, kF32Tolerance) << variant;
  EXPECT_GT(r->stats.verify_max_rel_error, 0.0) << "the reference did not run";
  EXPECT_EQ(r->stats.blocks_leaked, 0);
  // The local layers kept their window and one step, over whole blocks, never the whole text.
  const int window = (*model)->config().sliding_window.window;
  const int step = std::min(chunk, static_cast<int>(prompt.size()));
  EXPECT_GT(r->stats.kv_local_blocks_peak, 0);
  EXPECT_LE(r->stats.kv_local_blocks_peak, KvStorage::local_blocks_per_sequence(window, block_size, step));
  if (window + step + 2 * block_size < 100) {
    EXPECT_LT(r->stats.kv_local_blocks_peak, r->stats.kv_blocks_peak);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, Gemma3ForwardTest,
    ::testing::Values(Case{"default", 1, 5}, Case{"default", 16, 5}, Case{"default", 16, 64}, Case{"default", 64, 64},
                      Case{"window5", 1, 5}, Case{"window5", 16, 64}, Case{"period3", 16, 5},
                      Case{"local_base", 16, 5}, Case{"linear", 16, 5}, Case{"mqa7", 1, 5}, Case{"mqa7", 16, 64},
                      Case{"layers62", 16, 5}),
    [](const auto& info) {
      return std::get<0>(info.param) + "_block" + std::to_string(std::get<1>(info.param)) + "_chunk" +
             std::to_string(std::get<2>(info.param));
    });

TEST(Gemma3Config, ReadsWhatTheFileStates) {
  auto m = LlamaModel::load(synth_file("default"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  const ModelConfig& c = (*m)->config();
  EXPECT_EQ(c.architecture, "gemma3");
  EXPECT_TRUE(c.has_qk_norm);
  EXPECT_TRUE(c.has_post_norms);
  EXPECT_EQ(c.ffn_activation, FfnActivation::kGeluTanh);
  EXPECT_EQ(c.rope.style, RopeStyle::kNeox);
  EXPECT_FLOAT_EQ(c.embedding_scale, 8.0f);                         // sqrt(64)
  EXPECT_FLOAT_EQ(c.attention_scale, 1.0f / std::sqrt(32.0f));      // head_dim 32
  EXPECT_EQ(c.sliding_window.window, 24);
  EXPECT_EQ(c.sliding_window.local_layers, (std::vector<uint8_t>{1, 1, 1, 1, 1, 0}));
  EXPECT_FLOAT_EQ(c.local_rope.freq_base, 10000.0f);
  EXPECT_FLOAT_EQ(c.rope.freq_base, 1000000.0f);
  EXPECT_EQ((*m)->weights().layers[0].post_attn_norm.size(), 64u);
  EXPECT_EQ((*m)->weights().layers[0].post_ffn_norm.size(), 64u);

  auto p3 = LlamaModel::load(synth_file("period3"));
  ASSERT_TRUE(p3.ok());
  EXPECT_EQ((*p3)->config().sliding_window.local_layers, (std::vector<uint8_t>{1, 1, 0, 1, 1, 0}));
  auto base = LlamaModel::load(synth_file("local_base"));
  ASSERT_TRUE(base.ok());
  EXPECT_FLOAT_EQ((*base)->config().local_rope.freq_base, 500.0f);
  // Linear scaling is the global layers' alone.
  auto linear = LlamaModel::load(synth_file("linear"));
  ASSERT_TRUE(linear.ok());
  EXPECT_FLOAT_EQ((*linear)->config().rope.freq_scale, 0.125f);
  EXPECT_FLOAT_EQ((*linear)->config().local_rope.freq_scale, 1.0f);
  // 27B's query_pre_attn_scalar is dim / heads (here 64 / 4 = 16), not head_dim.
  auto big = LlamaModel::load(synth_file("layers62"));
  ASSERT_TRUE(big.ok());
  EXPECT_FLOAT_EQ((*big)->config().attention_scale, 0.25f);
}

// The window is not decoration: the same weights with a window wider than the text give other
// logits once a query's window excludes tokens, and the same ones before that.
TEST(Gemma3Config, TheWindowChangesTheModelPastItsLength) {
  auto narrow = LlamaModel::load(synth_file("default"));
  auto wide = LlamaModel::load(synth_file("wide_window"));
  ASSERT_TRUE(narrow.ok() && wide.ok());
  std::vector<TokenId> tokens;
  for (int i = 0; i < 40; ++i) tokens.push_back(static_cast<TokenId>(1 + (i * 53) % 500));
  const std::vector<double> a = reference_logits((*narrow)->config(), (*narrow)->weights(), tokens);
  const std::vector<double> b = reference_logits((*wide)->config(), (*wide)->weights(), tokens);
  const size_t vocab = 512;
  auto row_diff = [&](size_t row) {
    double d = 0;
    for (size_t i = 0; i < vocab; ++i) d = std::max(d, std::fabs(a[row * vocab + i] - b[row * vocab + i]));
    return d;
  };
  EXPECT_LT(row_diff(23), 1e-9);  // position 23 sees 24 tokens: all of them
  EXPECT_GT(row_diff(39), 1e-3);
}

// A file rewritten with one metadata change.
std::string with_metadata(const std::string& variant, const std::function<void(GgufWriter&)>& edit,
                          const std::string& skip_key = "") {
  const std::string src = synth_file(variant);
  return testing::rewrite_gguf_metadata(src, src + ".edited.gguf", edit, skip_key);
}

TEST(Gemma3Config, WhatKvlmCannotRunAsStatedIsAnErrorNamingIt) {
  auto expect_error = [](const std::string& path, const std::string& needle) {
    auto m = LlamaModel::load(path);
    ASSERT_FALSE(m.ok()) << path;
    EXPECT_NE(m.status().message().find(needle), std::string::npos) << m.status().message();
  };
  expect_error(with_metadata("default", [](GgufWriter&) {}, "gemma3.attention.sliding_window"),
               "missing metadata 'gemma3.attention.sliding_window'");
  expect_error(with_metadata("default",
                             [](GgufWriter& w) {
                               w.set("gemma3.attention.sliding_window_pattern",
                                     GgufValue::i32_array({1, 1, 0}));
                             }),
               "has 3 entries for 6 layers");
  expect_error(with_metadata("default", [](GgufWriter& w) { w.set_u32("gemma3.attention.sliding_window", 0); }),
               "out of range");
  expect_error(with_metadata("default", [](GgufWriter& w) { w.set_f32("gemma3.rope.freq_base_swa", -1.0f); }),
               "must be a positive number");
  // A llama file that states a window kvlm would not apply is refused, not run without it.
  const auto dir = testing::scratch_dir("gemma3_llama_window");
  SynthOptions options;
  options.shape = *synth_preset("tiny-gqa");
  options.out_path = (dir / "llama.gguf").string();
  ASSERT_TRUE(synthesize_model(options).ok());
  testing::rewrite_gguf_metadata(options.out_path, options.out_path + ".edited.gguf",
                                 [](GgufWriter& w) { w.set_u32("llama.attention.sliding_window", 4096); });
  expect_error(options.out_path + ".edited.gguf", "refusing rather than ignoring the window");
}

}  // namespace
}  // namespace kvlm
