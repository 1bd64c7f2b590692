// synthesize_model for architecture "deepseek2": presets, validation, and files read back with GgufFile
// holding exactly the keys, tensors and values that llama.cpp's converters write (keys and names spelled
// out here, not taken from the writer's own tables, so a typo there fails).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <variant>

#include <fmt/format.h>

#include "core/quantize.h"
#include "gguf/gguf_file.h"
#include "model/model_synthesizer.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

namespace fs = std::filesystem;

const std::vector<std::string> kTinyPresets = {"deepseek2-tiny",             "deepseek2-tiny-qlora",
                                               "deepseek2-tiny-moe",         "deepseek2-tiny-moe-sigmoid",
                                               "deepseek2-tiny-split",       "deepseek2-tiny-yarn"};

SynthShape preset(const std::string& name) {
  auto shape = synth_preset(name);
  EXPECT_TRUE(shape.ok()) << shape.status().message();
  return shape.ok() ? *shape : SynthShape{};
}

SynthShape with_layout(SynthShape s, SynthMlaLayout layout) {
  s.mla_layout = layout;
  return s;
}

std::vector<float> tensor_floats(const GgufTensorInfo& t) {
  std::vector<float> out(static_cast<size_t>(t.num_elements()));
  const int64_t cols = t.dims[0];
  const uint64_t row_bytes = ggml_row_bytes(t.type, cols);
  for (int64_t r = 0; r < t.num_elements() / cols; ++r) {
    dequantize_row_reference(t.type, t.data + static_cast<uint64_t>(r) * row_bytes, out.data() + r * cols, cols);
  }
  return out;
}

class SynthDeepseek2Test : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::scratch_dir(::testing::UnitTest::GetInstance()->current_test_info()->name()); }

  std::unique_ptr<GgufFile> synth(const std::string& file, const SynthShape& shape, GgmlType type = GgmlType::kF32,
                                  uint64_t seed = 1) {
    SynthOptions o;
    o.shape = shape;
    o.weight_type = type;
    o.seed = seed;
    o.out_path = (dir_ / file).string();
    o.num_threads = 2;
    const Status s = synthesize_model(o);
    EXPECT_TRUE(s.ok()) << s.message();
    auto f = GgufFile::open(o.out_path);
    EXPECT_TRUE(f.ok()) << f.status().message();
    return f.ok() ? std::move(*f) : nullptr;
  }

  fs::path dir_;
};

TEST(SynthDeepseek2Presets, ShapesOfTheNamedModels) {
  const SynthShape lite = preset("deepseek-v2-lite");
  EXPECT_EQ(lite.architecture, "deepseek2");
  EXPECT_EQ(lite.num_layers, 27);
  EXPECT_EQ(lite.dim, 2048);
  EXPECT_EQ(lite.num_heads, 16);
  EXPECT_EQ(lite.q_lora_rank, 0);
  EXPECT_EQ(lite.kv_lora_rank, 512);
  EXPECT_EQ(lite.qk_nope_dim, 128);
  EXPECT_EQ(lite.qk_rope_dim, 64);
  EXPECT_EQ(lite.v_head_dim, 128);
  EXPECT_EQ(lite.ffn_dim, 10944);
  EXPECT_EQ(lite.leading_dense_layers, 1);
  EXPECT_EQ(lite.num_experts, 64);
  EXPECT_EQ(lite.num_experts_used, 6);
  EXPECT_EQ(lite.num_shared_experts, 2);
  EXPECT_EQ(lite.expert_ffn_dim, 1408);
  EXPECT_EQ(lite.expert_gating, SynthExpertGating::kSoftmax);
  EXPECT_FALSE(lite.expert_weights_norm);
  EXPECT_EQ(lite.expert_weights_scale, 1.0f);
  EXPECT_FALSE(lite.expert_bias);
  EXPECT_EQ(lite.vocab_size, 102400);
  EXPECT_EQ(lite.context_length, 163840);
  EXPECT_EQ(lite.rope_freq_base, 10000.0f);
  EXPECT_EQ(lite.rms_eps, 1e-6f);
  EXPECT_FALSE(lite.tied_output);
  EXPECT_EQ(lite.rope_scaling.type, "yarn");
  EXPECT_EQ(lite.rope_scaling.factor, 40.0f);
  EXPECT_EQ(lite.rope_scaling.original_context, 4096);
  EXPECT_EQ(lite.rope_scaling.yarn_log_multiplier, 0.0707f);
  EXPECT_EQ(lite.mla_layout, SynthMlaLayout::kSplit);
  // DeepSeek-V2-Lite has 15.7B parameters.
  EXPECT_NEAR(static_cast<double>(lite.num_parameters()), 15.7e9, 0.05e9);

  // The benchmark variant: the same attention, a 1-2 GB Q8_0 file (34 bytes per 32 weights).
  const SynthShape attn = preset("deepseek-v2-lite-attn");
  EXPECT_EQ(attn.kv_lora_rank, lite.kv_lora_rank);
  EXPECT_EQ(attn.qk_nope_dim, lite.qk_nope_dim);
  EXPECT_EQ(attn.qk_rope_dim, lite.qk_rope_dim);
  EXPECT_EQ(attn.v_head_dim, lite.v_head_dim);
  EXPECT_EQ(attn.num_heads, lite.num_heads);
  EXPECT_EQ(attn.num_layers, lite.num_layers);
  EXPECT_EQ(attn.num_experts_used, 6);
  EXPECT_EQ(attn.num_shared_experts, 2);
  const double q8_bytes = static_cast<double>(attn.num_parameters()) * 34.0 / 32.0;
  EXPECT_GT(q8_bytes, 1.0e9);
  EXPECT_LT(q8_bytes, 2.0e9);

  for (const std::string& name : kTinyPresets) {
    const SynthShape s = preset(name);
    EXPECT_TRUE(s.validate().ok()) << name << ": " << s.validate().message();
    EXPECT_EQ(s.architecture, "deepseek2") << name;
    // llama.cpp reads a file without q_lora_rank only at V2-Lite's 27 layers (or 26).
    EXPECT_EQ(s.num_layers, s.q_lora_rank > 0 ? 3 : 27) << name;
    EXPECT_FALSE(synth_llama_cpp_incompatibility(s).has_value()) << name;
    EXPECT_EQ(s.dim, 64) << name;
    EXPECT_EQ(s.num_heads, 4) << name;
    EXPECT_EQ(s.kv_lora_rank, 32) << name;
    EXPECT_EQ(s.qk_nope_dim, 32) << name;
    EXPECT_EQ(s.qk_rope_dim, 16) << name;
    EXPECT_EQ(s.v_head_dim, 32) << name;
    EXPECT_EQ(s.vocab_size, 512) << name;
    EXPECT_EQ(s.context_length, 256) << name;
  }
  EXPECT_EQ(preset("deepseek2-tiny").num_experts, 0);
  EXPECT_EQ(preset("deepseek2-tiny").leading_dense_layers, 27);
  EXPECT_EQ(preset("deepseek2-tiny").mla_layout, SynthMlaLayout::kKvB);
  EXPECT_GT(preset("deepseek2-tiny-qlora").q_lora_rank, 0);
  const SynthShape moe = preset("deepseek2-tiny-moe");
  EXPECT_EQ(moe.leading_dense_layers, 25);  // two routed layers: see deepseek2_tiny_moe
  EXPECT_EQ(moe.num_experts, 8);
  EXPECT_EQ(moe.num_experts_used, 2);
  EXPECT_EQ(moe.num_shared_experts, 1);
  EXPECT_EQ(moe.expert_ffn_dim, 32);
  const SynthShape sigmoid = preset("deepseek2-tiny-moe-sigmoid");
  EXPECT_EQ(sigmoid.expert_gating, SynthExpertGating::kSigmoid);
  EXPECT_TRUE(sigmoid.expert_bias);
  EXPECT_TRUE(sigmoid.expert_weights_norm);
  EXPECT_EQ(sigmoid.expert_weights_scale, 2.5f);
  EXPECT_EQ(preset("deepseek2-tiny-split").mla_layout, SynthMlaLayout::kSplit);
  EXPECT_EQ(preset("deepseek2-tiny-split").num_experts, 8);
  const SynthShape yarn = preset("deepseek2-tiny-yarn");
  EXPECT_EQ(yarn.q_lora_rank, preset("deepseek2-tiny-qlora").q_lora_rank);
  EXPECT_EQ(yarn.rope_scaling.type, "yarn");
  EXPECT_EQ(yarn.rope_scaling.factor, 4.0f);
  EXPECT_EQ(yarn.rope_scaling.original_context, 64);
  EXPECT_EQ(yarn.rope_scaling.yarn_log_multiplier, 0.1f);
}

TEST(SynthDeepseek2Presets, LlamaCppIncompatibilityIsNamed) {
  SynthShape s = preset("deepseek2-tiny-moe");
  EXPECT_FALSE(synth_llama_cpp_incompatibility(s).has_value());
  s.num_layers = 26;
  EXPECT_FALSE(synth_llama_cpp_incompatibility(s).has_value());
  s.num_layers = 3;
  const auto why = synth_llama_cpp_incompatibility(s);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("deepseek2.attention.q_lora_rank"), std::string::npos) << *why;
  s.q_lora_rank = 64;
  EXPECT_FALSE(synth_llama_cpp_incompatibility(s).has_value());
  s.num_layers = 27;  // taken for V2-Lite: no q bottleneck
  ASSERT_TRUE(synth_llama_cpp_incompatibility(s).has_value());
  EXPECT_NE(synth_llama_cpp_incompatibility(s)->find("attn_q.weight"), std::string::npos);
  s = preset("deepseek2-tiny-moe");
  s.num_shared_experts = 0;
  ASSERT_TRUE(synth_llama_cpp_incompatibility(s).has_value());
  EXPECT_NE(synth_llama_cpp_incompatibility(s)->find("blk.25.ffn_gate_shexp.weight"), std::string::npos);
  EXPECT_FALSE(synth_llama_cpp_incompatibility(preset("tiny-gqa")).has_value());
  for (const std::string& name : synth_preset_names()) {
    EXPECT_FALSE(synth_llama_cpp_incompatibility(preset(name)).has_value()) << name;
  }
}

TEST(SynthDeepseek2Validate, NamesTheBadField) {
  auto error_of = [](SynthShape s) { return s.validate().message(); };
  auto expect_error = [&](SynthShape s, const std::string& text) {
    const std::string e = error_of(s);
    EXPECT_NE(e.find(text), std::string::npos) << "expected '" << text << "' in '" << e << "'";
  };
  const SynthShape moe = preset("deepseek2-tiny-moe");
  SynthShape s = moe;
  s.num_experts_used = 9;
  expect_error(s, "num_experts_used = 9");
  s = moe;
  s.num_experts_used = 0;
  expect_error(s, "num_experts_used = 0");
  s = moe;
  s.qk_rope_dim = 15;
  s.head_dim = s.qk_nope_dim + 15;
  expect_error(s, "qk_rope_dim = 15 must be even");
  s = moe;
  s.kv_lora_rank = 0;
  expect_error(s, "kv_lora_rank");
  s = moe;
  s.head_dim = 32;
  expect_error(s, "head_dim = 32 must be qk_nope_dim + qk_rope_dim = 48");
  s = moe;
  s.num_kv_heads = 1;
  expect_error(s, "num_kv_heads = 1");
  s = moe;
  s.leading_dense_layers = 27;
  expect_error(s, "leading_dense_layers = 27 leaves no MoE layer");
  s = moe;
  s.leading_dense_layers = 28;
  expect_error(s, "leading_dense_layers = 28");
  s = moe;
  s.expert_ffn_dim = 0;
  expect_error(s, "expert_ffn_dim = 0");
  s = moe;
  s.expert_bias = true;  // softmax gating
  expect_error(s, "expert_bias");
  s = moe;
  s.expert_weights_scale = 0.0f;
  expect_error(s, "expert_weights_scale = 0");
  s = moe;
  s.expert_gating = static_cast<SynthExpertGating>(3);
  expect_error(s, "expert_gating = 3");
  s = moe;
  s.rope_scaling.yarn_log_multiplier = 0.1f;  // no yarn
  expect_error(s, "yarn_log_multiplier");
  s = moe;
  s.rope_scaling.type = "llama3";
  s.rope_scaling.original_context = 64;
  expect_error(s, "llama3");
  s = moe;
  s.q_lora_rank = -1;
  expect_error(s, "q_lora_rank = -1");
  s = moe;
  s.v_head_dim = 0;
  expect_error(s, "v_head_dim = 0");
  s = preset("deepseek2-tiny");
  s.num_experts_used = 2;  // no experts
  expect_error(s, "num_experts = 0");
  s = preset("deepseek2-tiny");
  s.leading_dense_layers = 1;  // no experts for the others
  expect_error(s, "leading_dense_layers = num_layers");

  // MLA and MoE fields belong to deepseek2.
  const SynthShape llama = preset("tiny-gqa");
  s = llama;
  s.kv_lora_rank = 32;
  expect_error(s, "kv_lora_rank = 32 is a deepseek2 field, not llama's");
  s = llama;
  s.num_experts = 8;
  expect_error(s, "num_experts = 8 is a deepseek2 field");
  s = llama;
  s.mla_layout = SynthMlaLayout::kSplit;
  expect_error(s, "mla_layout");
  s = llama;
  s.expert_gating = SynthExpertGating::kSigmoid;
  expect_error(s, "expert_gating");
  s = llama;
  s.rope_scaling.type = "yarn";
  s.rope_scaling.original_context = 64;
  s.rope_scaling.yarn_log_multiplier = 0.1f;
  expect_error(s, "yarn_log_multiplier");
}

// One expected key: its GGUF type and value.
struct Expected {
  GgufType type;
  std::variant<int64_t, double, bool, std::string> value;
};

std::map<std::string, Expected> expected_deepseek2_keys(const SynthShape& s) {
  const auto u32 = [](int64_t v) { return Expected{GgufType::kUint32, v}; };
  const auto f32 = [](double v) { return Expected{GgufType::kFloat32, static_cast<double>(static_cast<float>(v))}; };
  std::map<std::string, Expected> k = {
      {"block_count", u32(s.num_layers)},
      {"context_length", u32(s.context_length)},
      {"embedding_length", u32(s.dim)},
      {"feed_forward_length", u32(s.ffn_dim)},
      {"attention.head_count", u32(s.num_heads)},
      {"attention.layer_norm_rms_epsilon", f32(s.rms_eps)},
      {"rope.freq_base", f32(s.rope_freq_base)},
      {"rope.dimension_count", u32(s.qk_rope_dim)},
      {"leading_dense_block_count", u32(s.leading_dense_layers)},
      {"attention.kv_lora_rank", u32(s.kv_lora_rank)},
      {"expert_feed_forward_length", u32(s.expert_ffn_dim)},
      {"expert_count", u32(s.num_experts)},
      {"expert_used_count", u32(s.num_experts_used)},
      {"expert_shared_count", u32(s.num_shared_experts)},
      {"expert_weights_scale", f32(s.expert_weights_scale)},
      {"expert_weights_norm", Expected{GgufType::kBool, s.expert_weights_norm}},
      {"expert_gating_func", u32(s.expert_gating == SynthExpertGating::kSigmoid ? 2 : 1)},
      {"vocab_size", u32(s.vocab_size)},
  };
  if (s.q_lora_rank > 0) k["attention.q_lora_rank"] = u32(s.q_lora_rank);
  if (s.mla_layout == SynthMlaLayout::kSplit) {
    k["attention.head_count_kv"] = u32(1);
    k["attention.key_length"] = u32(s.kv_lora_rank + s.qk_rope_dim);
    k["attention.value_length"] = u32(s.kv_lora_rank);
    k["attention.key_length_mla"] = u32(s.qk_nope_dim + s.qk_rope_dim);
    k["attention.value_length_mla"] = u32(s.v_head_dim);
  } else {
    k["attention.head_count_kv"] = u32(s.num_heads);
    k["attention.key_length"] = u32(s.qk_nope_dim + s.qk_rope_dim);
    k["attention.value_length"] = u32(s.v_head_dim);
  }
  if (s.rope_scaling.type == "yarn") {
    k["rope.scaling.type"] = Expected{GgufType::kString, std::string("yarn")};
    k["rope.scaling.factor"] = f32(s.rope_scaling.factor);
    k["rope.scaling.original_context_length"] = u32(s.rope_scaling.original_context);
    if (s.rope_scaling.yarn_log_multiplier != 0.0f) {
      k["rope.scaling.yarn_log_multiplier"] = f32(s.rope_scaling.yarn_log_multiplier);
    }
  }
  return k;
}

using TensorDims = std::map<std::string, std::vector<int64_t>>;

TensorDims expected_deepseek2_tensors(const SynthShape& s) {
  const int64_t d = s.dim, h = s.num_heads, nope = s.qk_nope_dim, rope = s.qk_rope_dim, v = s.v_head_dim;
  const int64_t kv = s.kv_lora_rank, q = s.q_lora_rank, vocab = s.vocab_size;
  TensorDims t = {{"token_embd.weight", {d, vocab}}, {"output_norm.weight", {d}}};
  if (!s.tied_output) t["output.weight"] = {d, vocab};
  for (int l = 0; l < s.num_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    t[b + "attn_norm.weight"] = {d};
    if (q > 0) {
      t[b + "attn_q_a.weight"] = {d, q};
      t[b + "attn_q_a_norm.weight"] = {q};
      t[b + "attn_q_b.weight"] = {q, h * (nope + rope)};
    } else {
      t[b + "attn_q.weight"] = {d, h * (nope + rope)};
    }
    t[b + "attn_kv_a_mqa.weight"] = {d, kv + rope};
    t[b + "attn_kv_a_norm.weight"] = {kv};
    if (s.mla_layout == SynthMlaLayout::kSplit) {
      t[b + "attn_k_b.weight"] = {nope, kv, h};
      t[b + "attn_v_b.weight"] = {kv, v, h};
    } else {
      t[b + "attn_kv_b.weight"] = {kv, h * (nope + v)};
    }
    t[b + "attn_output.weight"] = {h * v, d};
    t[b + "ffn_norm.weight"] = {d};
    if (s.num_experts == 0 || l < s.leading_dense_layers) {
      t[b + "ffn_gate.weight"] = {d, s.ffn_dim};
      t[b + "ffn_up.weight"] = {d, s.ffn_dim};
      t[b + "ffn_down.weight"] = {s.ffn_dim, d};
      continue;
    }
    const int64_t e = s.num_experts, f = s.expert_ffn_dim;
    t[b + "ffn_gate_inp.weight"] = {d, e};
    t[b + "ffn_gate_exps.weight"] = {d, f, e};
    t[b + "ffn_up_exps.weight"] = {d, f, e};
    t[b + "ffn_down_exps.weight"] = {f, d, e};
    if (s.num_shared_experts > 0) {
      t[b + "ffn_gate_shexp.weight"] = {d, f * s.num_shared_experts};
      t[b + "ffn_up_shexp.weight"] = {d, f * s.num_shared_experts};
      t[b + "ffn_down_shexp.weight"] = {f * s.num_shared_experts, d};
    }
    if (s.expert_bias) t[b + "exp_probs_b.bias"] = {e};
  }
  return t;
}

// Every tiny preset in both layouts and both weight types: exactly the keys and tensors above.
TEST_F(SynthDeepseek2Test, TinyFilesHoldExactlyTheConvertersKeysAndTensors) {
  for (const std::string& name : kTinyPresets) {
    for (SynthMlaLayout layout : {SynthMlaLayout::kKvB, SynthMlaLayout::kSplit}) {
      for (GgmlType type : {GgmlType::kF32, GgmlType::kQ8_0}) {
        const SynthShape s = with_layout(preset(name), layout);
        const std::string label =
            fmt::format("{}-{}-{}", name, layout == SynthMlaLayout::kSplit ? "split" : "kv_b", ggml_type_name(type));
        SCOPED_TRACE(label);
        const std::unique_ptr<GgufFile> f = synth(label + ".gguf", s, type);
        ASSERT_NE(f, nullptr);
        EXPECT_EQ(*f->get_string("general.architecture"), "deepseek2");
        EXPECT_EQ(*f->get_int("general.file_type"), type == GgmlType::kF32 ? 0 : 7);

        std::map<std::string, Expected> keys = expected_deepseek2_keys(s);
        for (const GgufKeyValue& kv : f->metadata()) {
          if (!kv.key.starts_with("deepseek2.")) {
            EXPECT_TRUE(kv.key.starts_with("general.") || kv.key.starts_with("tokenizer.")) << kv.key;
            continue;
          }
          const std::string suffix = kv.key.substr(std::string("deepseek2.").size());
          auto it = keys.find(suffix);
          if (it == keys.end()) {
            ADD_FAILURE() << "unexpected key " << kv.key;
            continue;
          }
          EXPECT_EQ(kv.value.type(), it->second.type) << kv.key;
          std::visit(
              [&](const auto& want) {
                using T = std::decay_t<decltype(want)>;
                if constexpr (std::is_same_v<T, int64_t>) {
                  EXPECT_EQ(kv.value.as_int().value_or(-1), want) << kv.key;
                } else if constexpr (std::is_same_v<T, double>) {
                  EXPECT_EQ(kv.value.as_float().value_or(-1), want) << kv.key;
                } else if constexpr (std::is_same_v<T, bool>) {
                  EXPECT_EQ(kv.value.as_bool().value_or(!want), want) << kv.key;
                } else {
                  EXPECT_EQ(std::string(kv.value.as_string().value_or("")), want) << kv.key;
                }
              },
              it->second.value);
          keys.erase(it);
        }
        for (const auto& [missing, _] : keys) ADD_FAILURE() << "missing key deepseek2." << missing;

        TensorDims tensors = expected_deepseek2_tensors(s);
        EXPECT_EQ(f->tensors().size(), tensors.size());
        for (const GgufTensorInfo& t : f->tensors()) {
          auto it = tensors.find(t.name);
          if (it == tensors.end()) {
            ADD_FAILURE() << "unexpected tensor " << t.name;
            continue;
          }
          EXPECT_EQ(t.dims, it->second) << t.name;
          // Every matrix row of the tiny presets fills Q8_0 blocks; vectors and the router stay F32.
          const bool f32_always = t.dims.size() == 1 || t.name.ends_with("ffn_gate_inp.weight");
          EXPECT_EQ(t.type, f32_always ? GgmlType::kF32 : type) << t.name;
          for (float x : tensor_floats(t)) ASSERT_TRUE(std::isfinite(x)) << t.name;
        }
      }
    }
  }
}

// attn_k_b and attn_v_b of a split file are attn_kv_b of the combined file of the same seed, rearranged.
TEST_F(SynthDeepseek2Test, SplitLayoutHoldsTheCombinedKvB) {
  const SynthShape s = preset("deepseek2-tiny-moe");
  const std::unique_ptr<GgufFile> kvb = synth("kv_b.gguf", with_layout(s, SynthMlaLayout::kKvB), GgmlType::kF32, 5);
  const std::unique_ptr<GgufFile> split = synth("split.gguf", with_layout(s, SynthMlaLayout::kSplit), GgmlType::kF32, 5);
  ASSERT_NE(kvb, nullptr);
  ASSERT_NE(split, nullptr);
  const int64_t heads = s.num_heads, nope = s.qk_nope_dim, v = s.v_head_dim, kv = s.kv_lora_rank;
  for (int l = 0; l < s.num_layers; ++l) {
    SCOPED_TRACE(l);
    const std::string b = "blk." + std::to_string(l) + ".";
    const std::vector<float> kv_b = tensor_floats(*kvb->find_tensor(b + "attn_kv_b.weight"));  // [heads*(nope+v), kv]
    const std::vector<float> k_b = tensor_floats(*split->find_tensor(b + "attn_k_b.weight"));   // [heads, kv, nope]
    const std::vector<float> v_b = tensor_floats(*split->find_tensor(b + "attn_v_b.weight"));   // [heads, v, kv]
    ASSERT_EQ(kv_b.size(), static_cast<size_t>(heads * (nope + v) * kv));
    ASSERT_EQ(k_b.size(), static_cast<size_t>(heads * kv * nope));
    ASSERT_EQ(v_b.size(), static_cast<size_t>(heads * v * kv));
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t j = 0; j < kv; ++j) {
        for (int64_t i = 0; i < nope; ++i) {
          ASSERT_EQ(k_b[(h * kv + j) * nope + i], kv_b[(h * (nope + v) + i) * kv + j]) << h << " " << j << " " << i;
        }
        for (int64_t r = 0; r < v; ++r) {
          ASSERT_EQ(v_b[(h * v + r) * kv + j], kv_b[(h * (nope + v) + nope + r) * kv + j]) << h << " " << r << " " << j;
        }
      }
    }
  }
  // Everything else is the same tensor, byte for byte.
  for (const GgufTensorInfo& t : kvb->tensors()) {
    if (t.name.ends_with("attn_kv_b.weight")) continue;
    const GgufTensorInfo* other = split->find_tensor(t.name);
    ASSERT_NE(other, nullptr) << t.name;
    ASSERT_EQ(t.num_bytes, other->num_bytes) << t.name;
    EXPECT_EQ(std::memcmp(t.data, other->data, t.num_bytes), 0) << t.name;
  }
  // In Q8_0, v_b's rows are kv_b's rows, so their blocks are the same bytes.
  const std::unique_ptr<GgufFile> kvb8 = synth("kv_b8.gguf", with_layout(s, SynthMlaLayout::kKvB), GgmlType::kQ8_0, 5);
  const std::unique_ptr<GgufFile> split8 =
      synth("split8.gguf", with_layout(s, SynthMlaLayout::kSplit), GgmlType::kQ8_0, 5);
  const GgufTensorInfo* kv_b8 = kvb8->find_tensor("blk.0.attn_kv_b.weight");
  const GgufTensorInfo* v_b8 = split8->find_tensor("blk.0.attn_v_b.weight");
  const uint64_t row_bytes = ggml_row_bytes(GgmlType::kQ8_0, kv);
  for (int64_t h = 0; h < heads; ++h) {
    EXPECT_EQ(std::memcmp(v_b8->data + static_cast<uint64_t>(h * v) * row_bytes,
                          kv_b8->data + static_cast<uint64_t>(h * (nope + v) + nope) * row_bytes, v * row_bytes),
              0)
        << h;
  }
}

// Sample std and mean of each deepseek2 tensor role (a name less its "blk.N.", over every layer)
// near its target: uniform samples, so the std estimate's relative error is ~0.45/sqrt(n).
TEST_F(SynthDeepseek2Test, WeightsHaveTheIntendedScales) {
  const SynthShape s = preset("deepseek2-tiny-moe-sigmoid");
  const std::unique_ptr<GgufFile> f = synth("scales.gguf", with_layout(s, SynthMlaLayout::kSplit));
  ASSERT_NE(f, nullptr);
  std::map<std::string, std::vector<float>> roles;
  for (const GgufTensorInfo& t : f->tensors()) {
    std::string role = t.name;
    if (role.starts_with("blk.")) role = role.substr(role.find('.', 4) + 1);
    const std::vector<float> v = tensor_floats(t);
    roles[role].insert(roles[role].end(), v.begin(), v.end());
  }
  const double layers2 = 2.0 * s.num_layers;
  const auto inv_sqrt = [](double x) { return 1.0 / std::sqrt(x); };
  const std::map<std::string, std::pair<double, double>> want = {  // role: {mean, std}
      {"token_embd.weight", {0, 2.0 * inv_sqrt(s.dim)}},
      {"output.weight", {0, 2.0 * inv_sqrt(s.dim)}},
      {"output_norm.weight", {1, 0.02}},
      {"attn_norm.weight", {1, 0.02}},
      {"attn_kv_a_norm.weight", {1, 0.02}},
      {"ffn_norm.weight", {1, 0.02}},
      {"attn_q.weight", {0, inv_sqrt(s.dim)}},
      {"attn_kv_a_mqa.weight", {0, inv_sqrt(s.dim)}},
      {"attn_k_b.weight", {0, inv_sqrt(s.kv_lora_rank)}},
      {"attn_v_b.weight", {0, inv_sqrt(s.kv_lora_rank)}},
      {"attn_output.weight", {0, inv_sqrt(s.num_heads * s.v_head_dim * layers2)}},
      {"ffn_gate.weight", {0, inv_sqrt(s.dim)}},
      {"ffn_up.weight", {0, inv_sqrt(s.dim)}},
      {"ffn_down.weight", {0, inv_sqrt(s.ffn_dim * layers2)}},
      {"ffn_gate_inp.weight", {0, 3.0 * inv_sqrt(s.dim)}},
      {"exp_probs_b.bias", {0, 0.1}},
      {"ffn_gate_exps.weight", {0, inv_sqrt(s.dim)}},
      {"ffn_up_exps.weight", {0, inv_sqrt(s.dim)}},
      {"ffn_down_exps.weight", {0, inv_sqrt(s.expert_ffn_dim * layers2)}},
      {"ffn_gate_shexp.weight", {0, inv_sqrt(s.dim)}},
      {"ffn_up_shexp.weight", {0, inv_sqrt(s.dim)}},
      {"ffn_down_shexp.weight", {0, inv_sqrt(s.expert_ffn_dim * s.num_shared_experts * layers2)}},
  };
  EXPECT_EQ(roles.size(), want.size());
  for (const auto& [role, v] : roles) {
    auto it = want.find(role);
    if (it == want.end()) {
      ADD_FAILURE() << "no expected scale for " << role;
      continue;
    }
    const auto [want_mean, want_std] = it->second;
    double sum = 0, sum_sq = 0;
    for (float x : v) {
      ASSERT_TRUE(std::isfinite(x)) << role;
      sum += x;
    }
    const double n = static_cast<double>(v.size());
    const double mean = sum / n;
    for (float x : v) sum_sq += (x - mean) * (x - mean);
    const double std = std::sqrt(sum_sq / n);
    // 5 sigma of the estimates.
    EXPECT_NEAR(std, want_std, 5 * 0.45 / std::sqrt(n) * want_std + 1e-3 * want_std) << role << " (" << v.size() << ")";
    EXPECT_NEAR(mean, want_mean, 5 * want_std / std::sqrt(n)) << role;
  }
}

TEST_F(SynthDeepseek2Test, QLoraScalesAndTiedOutput) {
  SynthShape s = preset("deepseek2-tiny-qlora");
  s.tied_output = true;
  const std::unique_ptr<GgufFile> f = synth("qlora.gguf", s);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->find_tensor("output.weight"), nullptr);
  EXPECT_EQ(static_cast<int64_t>(f->tensors().size()), static_cast<int64_t>(expected_deepseek2_tensors(s).size()));
  const std::vector<float> q_b = tensor_floats(*f->find_tensor("blk.0.attn_q_b.weight"));
  double sum_sq = 0;
  for (float x : q_b) sum_sq += static_cast<double>(x) * x;
  EXPECT_NEAR(std::sqrt(sum_sq / static_cast<double>(q_b.size())), 1.0 / std::sqrt(s.q_lora_rank),
              0.05 / std::sqrt(s.q_lora_rank));
  // Parameter count: every element of the file.
  int64_t elements = 0;
  for (const GgufTensorInfo& t : f->tensors()) elements += t.num_elements();
  EXPECT_EQ(elements, s.num_parameters());
}

TEST_F(SynthDeepseek2Test, ParameterCountIsEveryElementOfTheFile) {
  for (const std::string& name : kTinyPresets) {
    for (SynthMlaLayout layout : {SynthMlaLayout::kKvB, SynthMlaLayout::kSplit}) {
      const SynthShape s = with_layout(preset(name), layout);
      const std::unique_ptr<GgufFile> f = synth("count.gguf", s);
      ASSERT_NE(f, nullptr);
      int64_t elements = 0;
      for (const GgufTensorInfo& t : f->tensors()) elements += t.num_elements();
      EXPECT_EQ(elements, s.num_parameters()) << name;
    }
  }
}

// A row length that is not a multiple of the type's block keeps that matrix F32, 3-D stacks included.
TEST_F(SynthDeepseek2Test, RowsThatDoNotFillBlocksStayF32) {
  SynthShape s = preset("deepseek2-tiny-split");
  s.qk_nope_dim = 40;  // attn_k_b rows of 40
  s.head_dim = s.qk_nope_dim + s.qk_rope_dim;
  s.expert_ffn_dim = 48;  // ffn_down_exps rows of 48
  const std::unique_ptr<GgufFile> f = synth("odd.gguf", s, GgmlType::kQ8_0);
  ASSERT_NE(f, nullptr);
  const std::string moe = "blk." + std::to_string(s.leading_dense_layers) + ".";  // the first MoE layer
  EXPECT_EQ(f->find_tensor(moe + "attn_k_b.weight")->type, GgmlType::kF32);
  EXPECT_EQ(f->find_tensor(moe + "attn_v_b.weight")->type, GgmlType::kQ8_0);
  EXPECT_EQ(f->find_tensor(moe + "ffn_down_exps.weight")->type, GgmlType::kF32);
  EXPECT_EQ(f->find_tensor(moe + "ffn_up_exps.weight")->type, GgmlType::kQ8_0);
  EXPECT_EQ(f->find_tensor(moe + "ffn_down_shexp.weight")->type, GgmlType::kF32);  // 48 * 1 shared
}

TEST_F(SynthDeepseek2Test, SameSeedSameBytesAnyThreadCount) {
  const SynthShape s = preset("deepseek2-tiny-split");
  std::vector<std::vector<uint8_t>> files;
  for (int threads : {1, 2}) {
    SynthOptions o;
    o.shape = s;
    o.weight_type = GgmlType::kQ8_0;
    o.seed = 3;
    o.num_threads = threads;
    o.out_path = (dir_ / ("t" + std::to_string(threads) + ".gguf")).string();
    ASSERT_TRUE(synthesize_model(o).ok());
    files.push_back(testing::read_bytes(o.out_path));
  }
  EXPECT_TRUE(files[0] == files[1]);
}

}  // namespace
}  // namespace kvlm
