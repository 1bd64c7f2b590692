// DeepSeek-V2 (deepseek2): the absorbed MLA forward over the latent cache, with dense and MoE
// FFNs, against the no-cache reference, which expands every head's key and value from the latent
// and routes each token itself; what the config reads from a file; the two up-projection layouts.
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "engine/generator.h"
#include "gguf/gguf_file.h"
#include "model/llama_model.h"
#include "model/model_synthesizer.h"
#include "model/moe_ffn.h"
#include "reference/reference_forward.h"
#include "support/gguf_rewrite.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

// F32 cache: only float-vs-double arithmetic differs from the reference.
constexpr double kF32Tolerance = 1e-4;

std::string synth_file(const std::string& preset, GgmlType type = GgmlType::kF32) {
  const std::string tag = preset + (type == GgmlType::kF32 ? "" : "_q8");
  const auto dir = testing::scratch_dir("deepseek2_" + tag);
  SynthOptions options;
  auto shape = synth_preset(preset);
  EXPECT_TRUE(shape.ok()) << shape.status().message();
  options.shape = *shape;
  options.weight_type = type;
  options.seed = 7;
  options.out_path = (dir / (tag + ".gguf")).string();
  const Status s = synthesize_model(options);
  EXPECT_TRUE(s.ok()) << s.message();
  return options.out_path;
}

GenerationResult generate(LlamaModel& model, const std::vector<TokenId>& prompt, int max_tokens, KvType kv_type,
                          int block_size, int chunk, bool verify = true) {
  ThreadPool pool(2);
  Generator generator(model, pool);
  GenerationOptions options;
  options.max_tokens = max_tokens;
  options.sampler.temperature = 0;
  options.k_type = options.v_type = kv_type;
  options.block_size = block_size;
  options.prefill_chunk = chunk;
  options.verify = verify;
  options.stop_at_eos = false;
  auto r = generator.generate(prompt, options, {});
  EXPECT_TRUE(r.ok()) << r.status().message();
  return std::move(r).value();
}

const std::vector<TokenId> kPrompt{1, 300, 17, 42, 99, 123, 7, 260, 261, 5, 77, 88};

using Case = std::tuple<std::string, int, int>;  // preset, block size, prefill chunk

class Deepseek2ForwardTest : public ::testing::TestWithParam<Case> {};

TEST_P(Deepseek2ForwardTest, EveryStepMatchesTheExpandedReference) {
  const auto& [preset, block_size, chunk] = GetParam();
  auto model = LlamaModel::load(synth_file(preset));
  ASSERT_TRUE(model.ok()) << model.status().message();
  const GenerationResult r = generate(**model, kPrompt, 38, KvType::kF32, block_size, chunk);
  EXPECT_EQ(r.tokens.size(), 50u);
  EXPECT_TRUE(r.stats.verified);
  EXPECT_LE(r.stats.verify_max_rel_error, kF32Tolerance) << preset;
  EXPECT_GT(r.stats.verify_max_rel_error, 0.0) << "the reference did not run";
  EXPECT_EQ(r.stats.blocks_leaked, 0);
  EXPECT_EQ(r.stats.kv_blocks_peak, (49 + block_size - 1) / block_size);
}

INSTANTIATE_TEST_SUITE_P(
    Variants, Deepseek2ForwardTest,
    ::testing::Values(Case{"deepseek2-tiny", 1, 5}, Case{"deepseek2-tiny", 16, 5}, Case{"deepseek2-tiny", 64, 64},
                      Case{"deepseek2-tiny-qlora", 16, 5}, Case{"deepseek2-tiny-qlora", 1, 64},
                      Case{"deepseek2-tiny-moe", 1, 5}, Case{"deepseek2-tiny-moe", 16, 64},
                      Case{"deepseek2-tiny-moe", 64, 5}, Case{"deepseek2-tiny-moe-sigmoid", 16, 5},
                      Case{"deepseek2-tiny-moe-sigmoid", 64, 64}, Case{"deepseek2-tiny-split", 16, 5},
                      Case{"deepseek2-tiny-split", 1, 64}, Case{"deepseek2-tiny-yarn", 16, 5},
                      Case{"deepseek2-tiny-yarn", 64, 64}),
    [](const auto& info) {
      std::string name = std::get<0>(info.param).substr(10) + "_block" + std::to_string(std::get<1>(info.param)) +
                         "_chunk" + std::to_string(std::get<2>(info.param));
      for (char& ch : name) ch = ch == '-' ? '_' : ch;
      return name;
    });

TEST(Deepseek2Config, ReadsWhatTheFileStates) {
  auto m = LlamaModel::load(synth_file("deepseek2-tiny-moe-sigmoid"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  const ModelConfig& c = (*m)->config();
  EXPECT_EQ(c.architecture, "deepseek2");
  EXPECT_TRUE(c.is_mla());
  EXPECT_EQ(c.attention_kind(), "MLA");
  EXPECT_EQ(c.mla.kv_lora_rank, 32);
  EXPECT_EQ(c.mla.qk_nope_dim, 32);
  EXPECT_EQ(c.mla.qk_rope_dim, 16);
  EXPECT_EQ(c.mla.v_head_dim, 32);
  EXPECT_EQ(c.mla.q_lora_rank, 0);
  EXPECT_FALSE(c.mla.split_kv_b);
  // The cache is one latent row: MQA of head_dim kv_lora + rope, values its first kv_lora.
  EXPECT_EQ(c.num_kv_heads, 1);
  EXPECT_EQ(c.head_dim, 48);
  const KvLayout layout = c.kv_layout(16);
  EXPECT_TRUE(layout.is_latent());
  EXPECT_EQ(layout.value_dim(), 32);
  EXPECT_FLOAT_EQ(c.attention_scale, 1.0f / std::sqrt(48.0f));
  EXPECT_EQ(c.rope.rotary_dim, 16);
  EXPECT_EQ(c.rope.style, RopeStyle::kNormal);
  EXPECT_EQ(c.moe.num_experts, 8);
  EXPECT_EQ(c.moe.num_experts_used, 2);
  EXPECT_EQ(c.moe.num_shared_experts, 1);
  EXPECT_EQ(c.moe.leading_dense_layers, 25);  // 27 layers (llama.cpp's rule without q_lora), the last 2 MoE
  EXPECT_EQ(c.moe.gating, ExpertGating::kSigmoid);
  EXPECT_TRUE(c.moe.normalize_weights);
  EXPECT_FLOAT_EQ(c.moe.weights_scale, 2.5f);
  EXPECT_TRUE(c.moe.has_expert_bias);
  EXPECT_FALSE(c.moe.is_moe_layer(24));
  EXPECT_TRUE(c.moe.is_moe_layer(25));

  auto split = LlamaModel::load(synth_file("deepseek2-tiny-split"));
  ASSERT_TRUE(split.ok()) << split.status().message();
  EXPECT_TRUE((*split)->config().mla.split_kv_b);
  EXPECT_EQ((*split)->config().head_dim, 48);

  // YaRN: cos and sin unscaled, q·k times mscale² = (1 + 0.1 ln 4)².
  auto yarn = LlamaModel::load(synth_file("deepseek2-tiny-yarn"));
  ASSERT_TRUE(yarn.ok()) << yarn.status().message();
  const ModelConfig& y = (*yarn)->config();
  EXPECT_EQ(y.mla.q_lora_rank, 96);
  const double mscale = 1.0 + 0.1 * std::log(4.0);
  EXPECT_NEAR(y.attention_scale, mscale * mscale / std::sqrt(48.0), 1e-6);
  EXPECT_NEAR(rope_magnitude(y.rope), 1.0, 1e-6);
}

// The same seed written with attn_kv_b and with attn_k_b + attn_v_b is one model: the absorbed
// forward gives the same logits from either (the split layout's W_UK_hᵀ is the file's, the
// combined one's is transposed at load).
TEST(Deepseek2Layouts, CombinedAndSplitGiveTheSameLogits) {
  auto combined = LlamaModel::load(synth_file("deepseek2-tiny-moe"));
  auto split = LlamaModel::load(synth_file("deepseek2-tiny-split"));
  ASSERT_TRUE(combined.ok() && split.ok());
  const GenerationResult a = generate(**combined, kPrompt, 20, KvType::kF32, 16, 5, false);
  const GenerationResult b = generate(**split, kPrompt, 20, KvType::kF32, 16, 5, false);
  EXPECT_EQ(a.tokens, b.tokens);
  const std::vector<double> ra = reference_logits((*combined)->config(), (*combined)->weights(), kPrompt);
  const std::vector<double> rb = reference_logits((*split)->config(), (*split)->weights(), kPrompt);
  ASSERT_EQ(ra.size(), rb.size());
  double diff = 0;
  for (size_t i = 0; i < ra.size(); ++i) diff = std::max(diff, std::fabs(ra[i] - rb[i]));
  EXPECT_LT(diff, 1e-9);
}

// The expanded form (every head's keys and values from the latents, every step) is the same
// attention: both match the reference, and give the same tokens, for prefill and decode.
TEST(Deepseek2Expanded, AgreesWithTheAbsorbedForm) {
  for (const char* preset : {"deepseek2-tiny-qlora", "deepseek2-tiny-split"}) {
    auto model = LlamaModel::load(synth_file(preset));
    ASSERT_TRUE(model.ok()) << model.status().message();
    const GenerationResult absorbed = generate(**model, kPrompt, 24, KvType::kF32, 16, 5);
    (*model)->set_mla_mode(MlaMode::kExpanded);
    const GenerationResult expanded = generate(**model, kPrompt, 24, KvType::kF32, 16, 5);
    EXPECT_LE(expanded.stats.verify_max_rel_error, kF32Tolerance) << preset;
    EXPECT_GT(expanded.stats.verify_max_rel_error, 0.0);
    EXPECT_EQ(expanded.tokens, absorbed.tokens) << preset;
    // With an f16 cache both read the same rounded rows.
    const GenerationResult expanded16 = generate(**model, kPrompt, 24, KvType::kF16, 1, 64, false);
    (*model)->set_mla_mode(MlaMode::kAbsorbed);
    const GenerationResult absorbed16 = generate(**model, kPrompt, 24, KvType::kF16, 1, 64, false);
    EXPECT_EQ(expanded16.tokens, absorbed16.tokens) << preset;
  }
}

// Quantized latents, decoded inside the attention kernel: each codec's error on the logits stays
// within 3× its nominal relative resolution (the same rule for every codec, measured 0.8-1.7×).
// Dense models: a MoE router may flip a choice under any perturbation, which is the router's
// sensitivity, not the codec's.
double nominal_resolution(KvType type) {
  switch (type) {
    case KvType::kF16: return std::ldexp(1.0, -11);  // 10 mantissa bits, half a step
    case KvType::kBf16: return std::ldexp(1.0, -8);  // 7 mantissa bits
    case KvType::kFp8: return std::ldexp(1.0, -4);   // e4m3: 3 mantissa bits
    case KvType::kInt8: return 1.0 / 127.0;          // a step of max|x| / 127
    case KvType::kInt4: return 2.0 / 15.0;           // 15 steps over a group's range
    default: return 0.0;
  }
}

class Deepseek2CodecTest : public ::testing::TestWithParam<std::tuple<std::string, KvType, int>> {};

TEST_P(Deepseek2CodecTest, QuantizedLatentsStayWithinTheCodecsResolution) {
  const auto& [preset, type, block_size] = GetParam();
  auto model = LlamaModel::load(synth_file(preset));
  ASSERT_TRUE(model.ok()) << model.status().message();
  const GenerationResult r = generate(**model, kPrompt, 30, type, block_size, 5);
  EXPECT_LE(r.stats.verify_max_rel_error, 3.0 * nominal_resolution(type)) << kv_type_name(type);
  EXPECT_GT(r.stats.verify_max_rel_error, 1e-6) << "the codec did not quantize";
  EXPECT_EQ(r.stats.blocks_leaked, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, Deepseek2CodecTest,
    ::testing::Combine(::testing::Values("deepseek2-tiny", "deepseek2-tiny-qlora"),
                       ::testing::Values(KvType::kF16, KvType::kBf16, KvType::kFp8, KvType::kInt8, KvType::kInt4),
                       ::testing::Values(1, 16, 64)),
    [](const auto& info) {
      std::string name = std::get<0>(info.param).substr(10) + "_" + std::string(kv_type_name(std::get<1>(info.param))) +
                         "_block" + std::to_string(std::get<2>(info.param));
      for (char& ch : name) ch = ch == '-' ? '_' : ch;
      return name;
    });

// The latent is all the cache holds: (kv_lora + rope) values per layer and token, no V.
TEST(Deepseek2Cache, BytesPerTokenAreTheLatents) {
  auto m = LlamaModel::load(synth_file("deepseek2-tiny-moe"));
  ASSERT_TRUE(m.ok());
  const ModelConfig& c = (*m)->config();
  const uint64_t values = static_cast<uint64_t>(c.num_layers) * (c.mla.kv_lora_rank + c.mla.qk_rope_dim);
  const GenerationResult f32 = generate(**m, kPrompt, 4, KvType::kF32, 16, 16, false);
  EXPECT_EQ(f32.stats.kv_bytes_per_token, values * 4);
  const GenerationResult f16 = generate(**m, kPrompt, 4, KvType::kF16, 16, 16, false);
  EXPECT_EQ(f16.stats.kv_bytes_per_token, values * 2);
}

// Routing rules, checked on hand-made logits.
TEST(MoeRouting, SoftmaxTopKWithAndWithoutNormalisation) {
  MoeConfig moe;
  moe.num_experts = 4;
  moe.num_experts_used = 2;
  const std::vector<float> logits{0.0f, 2.0f, 1.0f, 2.0f};
  std::vector<ExpertChoice> out;
  route_token(moe, logits, {}, out);
  ASSERT_EQ(out.size(), 2u);
  // Ties go to the lower index: experts 1 and 3, each exp(2) / sum.
  const double sum = 1 + 2 * std::exp(2.0) + std::exp(1.0);
  EXPECT_EQ(out[0].expert, 1);
  EXPECT_EQ(out[1].expert, 3);
  EXPECT_NEAR(out[0].weight, std::exp(2.0) / sum, 1e-6);
  moe.normalize_weights = true;
  moe.weights_scale = 2.0f;
  route_token(moe, logits, {}, out);
  EXPECT_NEAR(out[0].weight, 1.0, 1e-6);
  EXPECT_NEAR(out[1].weight, 1.0, 1e-6);
}

TEST(MoeRouting, SigmoidBiasChoosesButDoesNotWeigh) {
  MoeConfig moe;
  moe.num_experts = 3;
  moe.num_experts_used = 1;
  moe.gating = ExpertGating::kSigmoid;
  const std::vector<float> logits{1.0f, 0.0f, -1.0f};
  const std::vector<float> bias{0.0f, 0.0f, 1.0f};  // sigmoid(-1) + 1 = 1.27 beats sigmoid(1) = 0.73
  std::vector<ExpertChoice> out;
  route_token(moe, logits, bias, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].expert, 2);
  EXPECT_NEAR(out[0].weight, 1.0 / (1.0 + std::exp(1.0)), 1e-6);
}

TEST(MoeRouting, GroupLimitedRoutingKeepsTheBestGroups) {
  MoeConfig moe;
  moe.num_experts = 6;
  moe.num_experts_used = 2;
  moe.gating = ExpertGating::kSigmoid;
  moe.num_groups = 3;
  moe.num_groups_used = 1;
  // Group 0 = {0, 1}, 1 = {2, 3}, 2 = {4, 5}: expert 4 is the best alone, but group 1's pair sums highest.
  const std::vector<float> logits{-3.0f, -3.0f, 1.5f, 1.5f, 3.0f, -3.0f};
  std::vector<ExpertChoice> out;
  route_token(moe, logits, {}, out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].expert, 2);
  EXPECT_EQ(out[1].expert, 3);
}

}  // namespace
}  // namespace kvlm
