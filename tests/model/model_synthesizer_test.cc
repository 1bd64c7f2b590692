#include "model/model_synthesizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <set>

#include "core/quantize.h"
#include "gguf/gguf_file.h"
#include "model/llama_gguf_names.h"
#include "model/llama_weights.h"
#include "model/model_config.h"
#include "model/synthetic_vocab.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

namespace names = llama_names;
namespace fs = std::filesystem;

std::vector<float> tensor_floats(const GgufTensorInfo& t) {
  std::vector<float> out(static_cast<size_t>(t.num_elements()));
  const int64_t cols = t.dims[0];
  const uint64_t row_bytes = ggml_row_bytes(t.type, cols);
  for (int64_t r = 0; r < t.num_elements() / cols; ++r) {
    dequantize_row_reference(t.type, t.data + static_cast<uint64_t>(r) * row_bytes, out.data() + r * cols, cols);
  }
  return out;
}

SynthShape preset(const char* name) {
  auto shape = synth_preset(name);
  EXPECT_TRUE(shape.ok()) << shape.status().message();
  return *shape;
}

class SynthTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::scratch_dir(::testing::UnitTest::GetInstance()->current_test_info()->name()); }

  fs::path synth(const std::string& file, const SynthShape& shape, GgmlType type = GgmlType::kF32, uint64_t seed = 1,
                 int num_threads = 2) {
    SynthOptions o;
    o.shape = shape;
    o.weight_type = type;
    o.seed = seed;
    o.out_path = (dir_ / file).string();
    o.num_threads = num_threads;
    const Status s = synthesize_model(o);
    EXPECT_TRUE(s.ok()) << s.message();
    return o.out_path;
  }

  fs::path dir_;
};

TEST(SynthPresets, ShapesOfTheNamedModels) {
  const SynthShape l32 = preset("llama-3.2-1b");
  EXPECT_EQ(l32.architecture, "llama");
  EXPECT_EQ(l32.num_layers, 16);
  EXPECT_EQ(l32.dim, 2048);
  EXPECT_EQ(l32.num_heads, 32);
  EXPECT_EQ(l32.num_kv_heads, 8);
  EXPECT_EQ(l32.head_dim, 64);
  EXPECT_EQ(l32.ffn_dim, 8192);
  EXPECT_EQ(l32.vocab_size, 128256);
  EXPECT_EQ(l32.context_length, 131072);
  EXPECT_TRUE(l32.tied_output);
  EXPECT_EQ(l32.rope_freq_base, 500000.0f);
  // Llama 3.2 1B has 1.24B parameters.
  EXPECT_NEAR(static_cast<double>(l32.num_parameters()), 1.2358e9, 0.001e9);

  const SynthShape l27 = preset("llama-2-7b");
  EXPECT_EQ(l27.num_layers, 32);
  EXPECT_EQ(l27.dim, 4096);
  EXPECT_EQ(l27.num_kv_heads, 32);
  EXPECT_EQ(l27.head_dim, 128);
  EXPECT_EQ(l27.ffn_dim, 11008);
  EXPECT_EQ(l27.vocab_size, 32000);
  EXPECT_FALSE(l27.tied_output);
  EXPECT_NEAR(static_cast<double>(l27.num_parameters()), 6.738e9, 0.001e9);  // Llama 2 7B: 6.74B

  EXPECT_EQ(preset("tiny-mha").num_kv_heads, preset("tiny-mha").num_heads);
  EXPECT_EQ(preset("tiny-gqa").num_heads / preset("tiny-gqa").num_kv_heads, 4);
  EXPECT_EQ(preset("tiny-mqa").num_kv_heads, 1);
  EXPECT_TRUE(preset("qwen2-tiny").qkv_bias);
  EXPECT_EQ(preset("qwen2-tiny").architecture, "qwen2");
  for (const std::string& name : synth_preset_names()) EXPECT_TRUE(preset(name.c_str()).validate().ok()) << name;
}

TEST(SynthPresets, UnknownNameListsThePresets) {
  auto shape = synth_preset("llama-9000");
  ASSERT_FALSE(shape.ok());
  EXPECT_NE(shape.status().message().find("llama-9000"), std::string::npos);
  for (const std::string& name : synth_preset_names()) {
    EXPECT_NE(shape.status().message().find(name), std::string::npos) << name;
  }
}

TEST(SynthShapeValidate, NamesTheBadField) {
  auto error_of = [](SynthShape s) { return s.validate().message(); };
  SynthShape s = preset("tiny-gqa");
  s.num_kv_heads = 3;
  EXPECT_NE(error_of(s).find("not a multiple of num_kv_heads = 3"), std::string::npos);
  s = preset("tiny-gqa");
  s.head_dim = 7;
  EXPECT_NE(error_of(s).find("head_dim = 7"), std::string::npos);
  s = preset("tiny-gqa");
  s.vocab_size = 100;
  EXPECT_NE(error_of(s).find("vocab_size = 100"), std::string::npos);
  s = preset("tiny-gqa");
  s.num_layers = 0;
  EXPECT_NE(error_of(s).find("num_layers = 0"), std::string::npos);
  s = preset("tiny-gqa");
  s.architecture = "gpt2";
  EXPECT_NE(error_of(s).find("gpt2"), std::string::npos);
  s = preset("tiny-gqa");
  s.rms_eps = 0;
  EXPECT_NE(error_of(s).find("rms_eps"), std::string::npos);

  SynthOptions o;
  o.shape = preset("tiny-mha");
  o.out_path = (testing::scratch_dir("SynthValidate") / "x.gguf").string();
  o.weight_type = GgmlType::kIQ2_XXS;
  EXPECT_NE(synthesize_model(o).message().find("not supported"), std::string::npos);
  EXPECT_FALSE(fs::exists(o.out_path));
}

TEST(SyntheticVocab, SpecialsBytesThenDistinctPieces) {
  for (int size : {kSynthMinVocabSize, 300, 32000, 128256}) {
    auto vocab = make_synthetic_vocab(size);
    ASSERT_TRUE(vocab.ok()) << vocab.status().message();
    const SpmVocab& v = *vocab;
    ASSERT_EQ(v.size(), size);
    ASSERT_EQ(v.scores.size(), static_cast<size_t>(size));
    ASSERT_EQ(v.token_types.size(), static_cast<size_t>(size));
    EXPECT_EQ(v.tokens[0], "<unk>");
    EXPECT_EQ(v.tokens[1], "<s>");
    EXPECT_EQ(v.tokens[2], "</s>");
    EXPECT_EQ(v.token_types[0], 2);
    EXPECT_EQ(v.token_types[1], 3);
    EXPECT_EQ(v.token_types[2], 3);
    EXPECT_EQ(v.tokens[3], "<0x00>");
    EXPECT_EQ(v.tokens[3 + 0x0A], "<0x0A>");
    EXPECT_EQ(v.tokens[258], "<0xFF>");
    for (int i = 3; i < 259; ++i) EXPECT_EQ(v.token_types[static_cast<size_t>(i)], 6) << i;
    EXPECT_EQ(v.tokens[259], "\xE2\x96\x81");
    std::set<std::string> distinct(v.tokens.begin(), v.tokens.end());
    EXPECT_EQ(distinct.size(), static_cast<size_t>(size));
    for (int i = 259; i < size; ++i) {
      const size_t id = static_cast<size_t>(i);
      ASSERT_EQ(v.token_types[id], 1) << i;
      ASSERT_FALSE(v.tokens[id].empty());
      ASSERT_FALSE(is_spm_byte_piece(v.tokens[id])) << v.tokens[id];
      ASSERT_EQ(v.tokens[id].find(' '), std::string::npos) << v.tokens[id];
      if (i > 259) {
        ASSERT_LT(v.scores[id], v.scores[id - 1]) << i;
      }
    }
  }
  auto big = make_synthetic_vocab(128256);
  ASSERT_TRUE(big.ok());
  const std::vector<std::string>& t = big->tokens;
  EXPECT_NE(std::find(t.begin(), t.end(), "\xE2\x96\x81the"), t.end());
  EXPECT_NE(std::find(t.begin(), t.end(), "th"), t.end());
  EXPECT_NE(std::find(t.begin(), t.end(), "\xE2\x96\x81" "ab"), t.end());

  auto too_small = make_synthetic_vocab(258);
  ASSERT_FALSE(too_small.ok());
  EXPECT_NE(too_small.status().message().find("258"), std::string::npos);
}

TEST_F(SynthTest, WritesEveryTensorAndTheMetadata) {
  for (const char* name : {"tiny-mha", "tiny-gqa", "tiny-mqa", "tiny-untied", "qwen2-tiny"}) {
    SCOPED_TRACE(name);
    const SynthShape s = preset(name);
    const fs::path path = synth(std::string(name) + ".gguf", s);
    auto file = GgufFile::open(path.string());
    ASSERT_TRUE(file.ok()) << file.status().message();
    const GgufFile& f = **file;
    const std::string& a = s.architecture;
    EXPECT_EQ(*f.get_string(names::kArchitecture), a);
    EXPECT_EQ(*f.get_string(names::kName), "synthetic");
    EXPECT_EQ(*f.get_int(names::key(a, names::kBlockCount)), s.num_layers);
    EXPECT_EQ(*f.get_int(names::key(a, names::kEmbeddingLength)), s.dim);
    EXPECT_EQ(*f.get_int(names::key(a, names::kHeadCount)), s.num_heads);
    EXPECT_EQ(*f.get_int(names::key(a, names::kHeadCountKv)), s.num_kv_heads);
    EXPECT_EQ(*f.get_int(names::key(a, names::kKeyLength)), s.head_dim);
    EXPECT_EQ(*f.get_int(names::key(a, names::kRopeDimensionCount)), s.head_dim);
    EXPECT_EQ(*f.get_int(names::key(a, names::kFeedForwardLength)), s.ffn_dim);
    EXPECT_EQ(*f.get_int(names::key(a, names::kContextLength)), s.context_length);
    EXPECT_EQ(*f.get_int(names::key(a, names::kVocabSize)), s.vocab_size);
    EXPECT_EQ(static_cast<float>(*f.get_float(names::key(a, names::kRopeFreqBase))), s.rope_freq_base);
    EXPECT_EQ(static_cast<float>(*f.get_float(names::key(a, names::kRmsEps))), s.rms_eps);
    EXPECT_EQ(f.get_string_array(names::kTokTokens)->size(), static_cast<size_t>(s.vocab_size));
    EXPECT_EQ(*f.get_string(names::kTokModel), "llama");

    const int64_t d = s.dim, q = s.q_dim(), kv = s.kv_dim(), ffn = s.ffn_dim, vocab = s.vocab_size;
    std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {{names::kTokenEmbd, {d, vocab}},
                                                                          {names::kOutputNorm, {d}}};
    if (!s.tied_output) expected.push_back({names::kOutput, {d, vocab}});
    for (int l = 0; l < s.num_layers; ++l) {
      expected.push_back({names::blk(l, names::kAttnNorm), {d}});
      expected.push_back({names::blk(l, names::kAttnQ), {d, q}});
      expected.push_back({names::blk(l, names::kAttnK), {d, kv}});
      expected.push_back({names::blk(l, names::kAttnV), {d, kv}});
      if (s.qkv_bias) {
        expected.push_back({names::blk(l, names::kAttnQBias), {q}});
        expected.push_back({names::blk(l, names::kAttnKBias), {kv}});
        expected.push_back({names::blk(l, names::kAttnVBias), {kv}});
      }
      expected.push_back({names::blk(l, names::kAttnOutput), {q, d}});
      expected.push_back({names::blk(l, names::kFfnNorm), {d}});
      expected.push_back({names::blk(l, names::kFfnGate), {d, ffn}});
      expected.push_back({names::blk(l, names::kFfnUp), {d, ffn}});
      expected.push_back({names::blk(l, names::kFfnDown), {ffn, d}});
    }
    EXPECT_EQ(f.tensors().size(), expected.size());
    for (const auto& [tensor, dims] : expected) {
      const GgufTensorInfo* t = f.find_tensor(tensor);
      ASSERT_NE(t, nullptr) << tensor;
      EXPECT_EQ(t->dims, dims) << tensor;
      EXPECT_EQ(t->type, GgmlType::kF32) << tensor;
    }

    // The file loads as a model of the same shape.
    auto config = ModelConfig::from_gguf(f);
    ASSERT_TRUE(config.ok()) << config.status().message();
    EXPECT_EQ(config->head_dim, s.head_dim);
    EXPECT_EQ(config->tied_output, s.tied_output);
    EXPECT_EQ(config->has_qkv_bias, s.qkv_bias);
    auto weights = LlamaWeights::bind(f, *config);
    EXPECT_TRUE(weights.ok()) << weights.status().message();
  }
}

TEST_F(SynthTest, SameSeedSameBytesAnyThreadCount) {
  const SynthShape s = preset("tiny-gqa");
  const std::vector<uint8_t> a = testing::read_bytes(synth("a.gguf", s, GgmlType::kQ8_0, 7, 1));
  const std::vector<uint8_t> b = testing::read_bytes(synth("b.gguf", s, GgmlType::kQ8_0, 7, 2));
  const std::vector<uint8_t> c = testing::read_bytes(synth("c.gguf", s, GgmlType::kQ8_0, 8, 2));
  ASSERT_GT(a.size(), 100000u);
  EXPECT_TRUE(a == b) << "same seed, 1 vs 2 threads";
  ASSERT_EQ(a.size(), c.size());
  EXPECT_FALSE(a == c) << "different seeds";

  // Different tensors and rows get different values, not copies.
  auto file = GgufFile::open((dir_ / "a.gguf").string());
  ASSERT_TRUE(file.ok());
  const std::vector<float> q0 = tensor_floats(*(*file)->find_tensor(names::blk(0, names::kAttnQ)));
  const std::vector<float> q1 = tensor_floats(*(*file)->find_tensor(names::blk(1, names::kAttnQ)));
  EXPECT_NE(q0, q1);
  EXPECT_FALSE(std::equal(q0.begin(), q0.begin() + 64, q0.begin() + 64));
}

// Sample std of every matrix within 5% of its target (uniform samples: the std estimate's
// relative error is about 0.45/sqrt(n), under 1% for these sizes); norms near 1.
TEST_F(SynthTest, TinyWeightsAreFiniteWithTheIntendedScales) {
  const SynthShape s = preset("qwen2-tiny");
  auto file = GgufFile::open(synth("scales.gguf", s).string());
  ASSERT_TRUE(file.ok());
  const float two_layers = 2.0f * static_cast<float>(s.num_layers);
  for (const GgufTensorInfo& t : (*file)->tensors()) {
    const std::vector<float> v = tensor_floats(t);
    double sum = 0, sum_sq = 0;
    for (float x : v) {
      ASSERT_TRUE(std::isfinite(x)) << t.name;
      sum += x;
    }
    const double mean = sum / static_cast<double>(v.size());
    for (float x : v) sum_sq += (x - mean) * (x - mean);
    const double std = std::sqrt(sum_sq / static_cast<double>(v.size()));
    const std::string& n = t.name;
    auto ends_with = [&n](std::string_view suffix) {
      return n.size() >= suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    double expected_std = 0, expected_mean = 0;
    if (n == names::kTokenEmbd) {
      expected_std = 2.0 / std::sqrt(static_cast<double>(s.dim));
    } else if (ends_with("norm.weight")) {
      expected_mean = 1.0;
      expected_std = 0.02;
    } else if (ends_with(".bias")) {
      expected_std = 0.1;
    } else if (ends_with(names::kAttnOutput)) {
      expected_std = 1.0 / std::sqrt(static_cast<double>(s.q_dim()) * two_layers);
    } else if (ends_with(names::kFfnDown)) {
      expected_std = 1.0 / std::sqrt(static_cast<double>(s.ffn_dim) * two_layers);
    } else {
      expected_std = 1.0 / std::sqrt(static_cast<double>(s.dim));
    }
    // Vectors hold only 16..64 values: looser bounds there.
    const double rel = v.size() >= 1024 ? 0.05 : 0.35;
    EXPECT_NEAR(std, expected_std, rel * expected_std) << n;
    EXPECT_NEAR(mean, expected_mean, 4.0 * expected_std / std::sqrt(static_cast<double>(v.size()))) << n;
  }
}

// The quantized file holds the same underlying values as the f32 one, within the type's error.
TEST_F(SynthTest, QuantizedWeightsMatchF32WeightsOfTheSameSeed) {
  const SynthShape s = preset("tiny-mha");
  auto f32 = GgufFile::open(synth("f32.gguf", s, GgmlType::kF32).string());
  ASSERT_TRUE(f32.ok());
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kF16, GgmlType::kBF16}) {
    SCOPED_TRACE(ggml_type_name(type));
    auto qf = GgufFile::open(synth(std::string(ggml_type_name(type)) + ".gguf", s, type).string());
    ASSERT_TRUE(qf.ok());
    // Per-element bound relative to the block's largest magnitude: half a q8_0 step (amax/127);
    // a whole q4_0 step (amax/8), as the side opposite the largest value clamps at 15 instead of 16;
    // plus the f16 rounding of the scale. f16/bf16 round each value.
    const float step = type == GgmlType::kQ8_0 ? 0.5f / 127 : type == GgmlType::kQ4_0 ? 1.0f / 8 : 0.0f;
    const float rel_value = type == GgmlType::kBF16 ? 1.0f / 256 : 1.0f / 2048;
    for (const GgufTensorInfo& t : (*qf)->tensors()) {
      const GgufTensorInfo* ref = (*f32)->find_tensor(t.name);
      ASSERT_NE(ref, nullptr) << t.name;
      EXPECT_EQ(t.type, t.dims.size() == 2 ? type : GgmlType::kF32) << t.name;
      const std::vector<float> exact = tensor_floats(*ref);
      const std::vector<float> approx = tensor_floats(t);
      ASSERT_EQ(exact.size(), approx.size());
      for (size_t b = 0; b < exact.size(); b += 32) {
        float amax = 0;
        for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(exact[i]));
        for (size_t i = b; i < b + 32; ++i) {
          const float tol = amax * (step + 1e-3f) + std::fabs(exact[i]) * rel_value;
          ASSERT_LE(std::fabs(exact[i] - approx[i]), tol) << t.name << " element " << i;
        }
      }
    }
    EXPECT_LT(fs::file_size(dir_ / (std::string(ggml_type_name(type)) + ".gguf")), fs::file_size(dir_ / "f32.gguf"));
  }
}

TEST_F(SynthTest, RowsThatDoNotFillBlocksStayF32) {
  SynthShape s = preset("tiny-mha");
  s.ffn_dim = 96 + 4;  // ffn_down rows of 100 elements cannot be q8_0 blocks
  auto file = GgufFile::open(synth("odd.gguf", s, GgmlType::kQ8_0).string());
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ((*file)->find_tensor(names::blk(0, names::kFfnDown))->type, GgmlType::kF32);
  EXPECT_EQ((*file)->find_tensor(names::blk(0, names::kFfnUp))->type, GgmlType::kQ8_0);
  EXPECT_EQ(*(*file)->get_int(names::kFileType), 7);
}

}  // namespace
}  // namespace kvlm
