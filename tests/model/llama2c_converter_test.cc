#include "model/llama2c_converter.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <vector>

#include "core/quantize.h"
#include "gguf/gguf_file.h"
#include "model/llama_gguf_names.h"
#include "model/llama_weights.h"
#include "model/model_config.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

namespace names = llama_names;
namespace fs = std::filesystem;

template <typename T>
void append(std::vector<uint8_t>& bytes, T v) {
  const size_t at = bytes.size();
  bytes.resize(at + sizeof(T));
  std::memcpy(bytes.data() + at, &v, sizeof(T));
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

// Bitwise equality, so -0.0 vs 0.0 or a changed NaN payload would count as a difference.
int64_t count_bit_differences(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return -1;
  int64_t diffs = 0;
  for (size_t i = 0; i < a.size(); ++i) diffs += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return diffs;
}

// A tiny llama2.c checkpoint built in memory: every weight section holds distinct, recognisable
// values (section * 1000 + index / 1000), so a swapped or misplaced section shows up exactly.
struct TinyCheckpoint {
  int dim = 8, hidden = 12, layers = 2, heads = 2, kv_heads = 1, vocab = 6, seq_len = 4;
  bool shared = false;
  // Section name -> values in file order.
  std::map<std::string, std::vector<float>> sections;

  int head_size() const { return dim / heads; }

  std::vector<uint8_t> bytes() {
    std::vector<uint8_t> out;
    for (int32_t v : {dim, hidden, layers, heads, kv_heads, shared ? vocab : -vocab, seq_len}) append(out, v);
    const int q = heads * head_size(), kv = kv_heads * head_size();
    const std::vector<std::pair<std::string, int64_t>> order = {
        {"token_embedding", vocab * dim}, {"rms_att", layers * dim},        {"wq", layers * q * dim},
        {"wk", layers * kv * dim},       {"wv", layers * kv * dim},         {"wo", layers * dim * q},
        {"rms_ffn", layers * dim},       {"w1", layers * hidden * dim},     {"w2", layers * dim * hidden},
        {"w3", layers * hidden * dim},   {"rms_final", dim},                {"freq_cis", seq_len * head_size()},
        {"wcls", shared ? 0 : vocab * dim}};
    int section = 1;
    for (const auto& [name, n] : order) {
      std::vector<float>& values = sections[name];
      values.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = static_cast<float>(section * 1000) + i / 1000.0f;
      for (float v : values) append(out, v);
      ++section;
    }
    return out;
  }

  // Values of layer `l` of a per-layer section.
  std::vector<float> layer(const std::string& section, int l) const {
    const std::vector<float>& all = sections.at(section);
    const size_t per_layer = all.size() / static_cast<size_t>(layers);
    return std::vector<float>(all.begin() + static_cast<std::ptrdiff_t>(per_layer * l),
                              all.begin() + static_cast<std::ptrdiff_t>(per_layer * (l + 1)));
  }
};

std::vector<uint8_t> tiny_tokenizer_bytes(const std::vector<std::string>& pieces, int32_t max_len = 7) {
  std::vector<uint8_t> out;
  append(out, max_len);
  for (size_t i = 0; i < pieces.size(); ++i) {
    append(out, -static_cast<float>(i));
    append(out, static_cast<int32_t>(pieces[i].size()));
    out.insert(out.end(), pieces[i].begin(), pieces[i].end());
  }
  return out;
}

const std::vector<std::string> kTinyPieces = {"<unk>", "\n<s>\n", "\n</s>\n", "<0x0A>", " a", "b c"};

class TinyConvertTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::scratch_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    checkpoint_ = dir_ / "tiny.bin";
    tokenizer_ = dir_ / "tok.bin";
    out_ = dir_ / "tiny.gguf";
  }
  Llama2cConvertOptions options() const {
    return Llama2cConvertOptions{checkpoint_.string(), tokenizer_.string(), out_.string(), "", GgmlType::kF32};
  }
  // Converts; returns the error message, or "" on success.
  std::string convert_error() const {
    const Status s = convert_llama2c(options());
    return s.ok() ? "" : s.message();
  }

  fs::path dir_, checkpoint_, tokenizer_, out_;
};

TEST_F(TinyConvertTest, MapsEverySectionToItsTensorWithExactValues) {
  TinyCheckpoint ck;
  testing::write_bytes(checkpoint_, ck.bytes());
  testing::write_bytes(tokenizer_, tiny_tokenizer_bytes(kTinyPieces));
  ASSERT_EQ(convert_error(), "");

  auto file = GgufFile::open(out_.string());
  ASSERT_TRUE(file.ok()) << file.status().message();
  const GgufFile& f = **file;
  auto expect_tensor = [&](const std::string& name, std::vector<int64_t> dims, const std::vector<float>& values) {
    const GgufTensorInfo* t = f.find_tensor(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->dims, dims) << name;
    EXPECT_EQ(t->type, GgmlType::kF32) << name;
    EXPECT_EQ(count_bit_differences(tensor_floats(*t), values), 0) << name;
  };
  const int64_t dim = ck.dim, hidden = ck.hidden, q = ck.heads * ck.head_size(), kv = ck.kv_heads * ck.head_size();
  expect_tensor(names::kTokenEmbd, {dim, ck.vocab}, ck.sections["token_embedding"]);
  expect_tensor(names::kOutputNorm, {dim}, ck.sections["rms_final"]);
  expect_tensor(names::kOutput, {dim, ck.vocab}, ck.sections["wcls"]);
  for (int l = 0; l < ck.layers; ++l) {
    expect_tensor(names::blk(l, names::kAttnNorm), {dim}, ck.layer("rms_att", l));
    expect_tensor(names::blk(l, names::kAttnQ), {dim, q}, ck.layer("wq", l));
    expect_tensor(names::blk(l, names::kAttnK), {dim, kv}, ck.layer("wk", l));
    expect_tensor(names::blk(l, names::kAttnV), {dim, kv}, ck.layer("wv", l));
    expect_tensor(names::blk(l, names::kAttnOutput), {q, dim}, ck.layer("wo", l));
    expect_tensor(names::blk(l, names::kFfnNorm), {dim}, ck.layer("rms_ffn", l));
    expect_tensor(names::blk(l, names::kFfnGate), {dim, hidden}, ck.layer("w1", l));
    expect_tensor(names::blk(l, names::kFfnDown), {hidden, dim}, ck.layer("w2", l));
    expect_tensor(names::blk(l, names::kFfnUp), {dim, hidden}, ck.layer("w3", l));
  }
  EXPECT_EQ(f.tensors().size(), static_cast<size_t>(3 + 9 * ck.layers));

  EXPECT_EQ(*f.get_string(names::kArchitecture), "llama");
  EXPECT_EQ(*f.get_string(names::kName), "tiny");
  EXPECT_EQ(*f.get_int("llama.context_length"), ck.seq_len);
  EXPECT_EQ(*f.get_int("llama.embedding_length"), dim);
  EXPECT_EQ(*f.get_int("llama.block_count"), ck.layers);
  EXPECT_EQ(*f.get_int("llama.feed_forward_length"), hidden);
  EXPECT_EQ(*f.get_int("llama.attention.head_count"), ck.heads);
  EXPECT_EQ(*f.get_int("llama.attention.head_count_kv"), ck.kv_heads);
  EXPECT_EQ(*f.get_int("llama.rope.dimension_count"), ck.head_size());
  EXPECT_EQ(*f.get_int("llama.vocab_size"), ck.vocab);
  EXPECT_FLOAT_EQ(static_cast<float>(*f.get_float("llama.attention.layer_norm_rms_epsilon")), 1e-5f);
  EXPECT_FLOAT_EQ(static_cast<float>(*f.get_float("llama.rope.freq_base")), 10000.0f);

  const std::vector<std::string> expected_tokens = {"<unk>", "<s>", "</s>", "<0x0A>", "\xE2\x96\x81" "a",
                                                    "b\xE2\x96\x81" "c"};
  EXPECT_EQ(*f.get_string_array(names::kTokTokens), expected_tokens);
  EXPECT_EQ(*f.get_int_array(names::kTokTypes), (std::vector<int64_t>{2, 3, 3, 6, 1, 1}));
  EXPECT_EQ(*f.get_float_array(names::kTokScores), (std::vector<float>{0, -1, -2, -3, -4, -5}));
  EXPECT_EQ(*f.get_string(names::kTokModel), "llama");
  EXPECT_EQ(*f.get_int(names::kTokBos), 1);
  EXPECT_EQ(*f.get_int(names::kTokEos), 2);
  EXPECT_EQ(*f.get_int(names::kTokUnk), 0);
  EXPECT_TRUE(*f.get_bool(names::kTokAddBos));
  EXPECT_TRUE(*f.get_bool(names::kTokAddSpacePrefix));
}

TEST_F(TinyConvertTest, SharedClassifierOmitsOutputAndNameOptionWins) {
  TinyCheckpoint ck;
  ck.shared = true;
  testing::write_bytes(checkpoint_, ck.bytes());
  testing::write_bytes(tokenizer_, tiny_tokenizer_bytes(kTinyPieces));
  Llama2cConvertOptions o = options();
  o.name = "my model";
  ASSERT_TRUE(convert_llama2c(o).ok());
  auto file = GgufFile::open(out_.string());
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ((*file)->find_tensor(names::kOutput), nullptr);
  EXPECT_NE((*file)->find_tensor(names::kTokenEmbd), nullptr);
  EXPECT_EQ(*(*file)->get_string(names::kName), "my model");
}

TEST_F(TinyConvertTest, RejectsBadCheckpointsWithFieldAndFile) {
  testing::write_bytes(tokenizer_, tiny_tokenizer_bytes(kTinyPieces));
  TinyCheckpoint good;
  const std::vector<uint8_t> valid = good.bytes();
  auto expect_error = [&](std::vector<uint8_t> bytes, const std::string& needle) {
    testing::write_bytes(checkpoint_, bytes);
    const std::string err = convert_error();
    EXPECT_NE(err.find(needle), std::string::npos) << "error: " << err << "\nexpected to contain: " << needle;
    EXPECT_NE(err.find(checkpoint_.string()), std::string::npos) << err;
    EXPECT_FALSE(fs::exists(out_));
  };
  auto with_header = [&](int field, int32_t value) {
    std::vector<uint8_t> b = valid;
    std::memcpy(b.data() + 4 * field, &value, 4);
    return b;
  };
  expect_error({}, "shorter than the 28-byte");
  expect_error(std::vector<uint8_t>(valid.begin(), valid.begin() + 20), "shorter than the 28-byte");
  expect_error(std::vector<uint8_t>(valid.begin(), valid.end() - 4), "truncated");
  std::vector<uint8_t> longer = valid;
  longer.push_back(0);
  expect_error(longer, "trailing");
  expect_error(with_header(0, 0), "dim = 0");
  expect_error(with_header(1, -5), "hidden_dim = -5");
  expect_error(with_header(2, 100000), "n_layers = 100000");
  expect_error(with_header(3, 3), "not a multiple of n_heads = 3");
  expect_error(with_header(4, 3), "n_kv_heads = 3");
  expect_error(with_header(5, 0), "vocab_size");
  expect_error(with_header(5, INT32_MIN), "vocab_size");
  expect_error(with_header(5, 6), "sign of vocab_size");  // says shared, but wcls is present
  expect_error(with_header(6, -1), "seq_len = -1");
  expect_error(with_header(0, 0x616b3432), "versioned llama2.c export");
  expect_error(with_header(0, 6), "must be even");  // head size 6 / 2 = 3
}

TEST_F(TinyConvertTest, RejectsBadTokenizers) {
  TinyCheckpoint ck;
  testing::write_bytes(checkpoint_, ck.bytes());
  auto expect_error = [&](const std::vector<uint8_t>& bytes, const std::string& needle) {
    testing::write_bytes(tokenizer_, bytes);
    const std::string err = convert_error();
    EXPECT_NE(err.find(needle), std::string::npos) << "error: " << err << "\nexpected to contain: " << needle;
    EXPECT_NE(err.find(tokenizer_.string()), std::string::npos) << err;
    EXPECT_FALSE(fs::exists(out_));
  };
  const std::vector<uint8_t> valid = tiny_tokenizer_bytes(kTinyPieces);
  expect_error({1, 0}, "too short for max_token_length");
  expect_error(tiny_tokenizer_bytes(kTinyPieces, 0), "max_token_length = 0");
  expect_error(tiny_tokenizer_bytes(kTinyPieces, 2), "token 0 (byte 4): length 5 is out of range");
  expect_error(std::vector<uint8_t>(valid.begin(), valid.end() - 1), "run past the end");
  expect_error(std::vector<uint8_t>(valid.begin(), valid.end() - 11), "file ends at token 5");
  expect_error(tiny_tokenizer_bytes({"<unk>", "<s>", "</s>", "a", "b"}), "vocab_size is 6");
  expect_error(tiny_tokenizer_bytes({"<unk>", "<s>", "</s>", "a", "b", "c", "d"}), "remain after 6 tokens");
  std::vector<uint8_t> negative_length = valid;
  const int32_t minus_one = -1;
  std::memcpy(negative_length.data() + 4 + 4, &minus_one, 4);  // token 0's length
  expect_error(negative_length, "length -1 is out of range");
  std::vector<uint8_t> nan_score = valid;
  const float nan = std::nanf("");
  std::memcpy(nan_score.data() + 4, &nan, 4);
  expect_error(nan_score, "score is NaN");
}

TEST_F(TinyConvertTest, MissingFilesAndBadOptionsAreErrors) {
  EXPECT_NE(convert_error().find("cannot open"), std::string::npos);
  TinyCheckpoint ck;
  testing::write_bytes(checkpoint_, ck.bytes());
  EXPECT_NE(convert_error().find(tokenizer_.string()), std::string::npos);
  testing::write_bytes(tokenizer_, tiny_tokenizer_bytes(kTinyPieces));
  Llama2cConvertOptions o = options();
  o.weight_type = GgmlType::kIQ2_XXS;
  EXPECT_NE(convert_llama2c(o).message().find("not supported"), std::string::npos);
}

// The reference GGUF was made from the same checkpoint and tokenizer by llama.cpp's converter.
TEST(Llama2cConverterShared, Stories260KMatchesReferenceGgufExactly) {
  KVLM_REQUIRE_SHARED(checkpoint, "stories260K.bin");
  KVLM_REQUIRE_SHARED(tokenizer, "tok512.bin");
  KVLM_REQUIRE_SHARED(reference_path, "stories260K.gguf");
  const fs::path out = testing::scratch_dir("Stories260KMatchesReferenceGgufExactly") / "stories260K.gguf";
  const Status s = convert_llama2c({checkpoint.string(), tokenizer.string(), out.string(), "", GgmlType::kF32});
  ASSERT_TRUE(s.ok()) << s.message();

  auto ours_r = GgufFile::open(out.string());
  ASSERT_TRUE(ours_r.ok()) << ours_r.status().message();
  auto ref_r = GgufFile::open(reference_path.string());
  ASSERT_TRUE(ref_r.ok()) << ref_r.status().message();
  const GgufFile& ours = **ours_r;
  const GgufFile& ref = **ref_r;

  // Every reference tensor, element by element. The reference stores the shared classifier
  // as a copy in output.weight; ours omits it, so it must equal our token_embd.
  for (const GgufTensorInfo& rt : ref.tensors()) {
    const bool shared_output = rt.name == names::kOutput && ours.find_tensor(names::kOutput) == nullptr;
    const GgufTensorInfo* ot = ours.find_tensor(shared_output ? names::kTokenEmbd : rt.name);
    ASSERT_NE(ot, nullptr) << rt.name;
    EXPECT_EQ(ot->dims, rt.dims) << rt.name;
    EXPECT_EQ(ot->type, rt.type) << rt.name;
    EXPECT_EQ(count_bit_differences(tensor_floats(*ot), tensor_floats(rt)), 0) << rt.name;
  }
  for (const GgufTensorInfo& t : ours.tensors()) EXPECT_NE(ref.find_tensor(t.name), nullptr) << t.name;
  EXPECT_EQ(ours.find_tensor(names::kOutput), nullptr);

  EXPECT_EQ(*ours.get_string_array(names::kTokTokens), *ref.get_string_array(names::kTokTokens));
  EXPECT_EQ(*ours.get_int_array(names::kTokTypes), *ref.get_int_array(names::kTokTypes));
  EXPECT_EQ(count_bit_differences(*ours.get_float_array(names::kTokScores), *ref.get_float_array(names::kTokScores)),
            0);
  // Hyper-parameters both files state agree (the reference's context_length 2048 is llama.cpp's
  // converter default; the checkpoint's seq_len 512 is the trained context).
  for (const char* key : {"llama.embedding_length", "llama.feed_forward_length", "llama.attention.head_count",
                          "llama.attention.head_count_kv", "llama.block_count", "llama.rope.dimension_count",
                          names::kTokBos, names::kTokEos, names::kTokUnk}) {
    EXPECT_EQ(*ours.get_int(key), *ref.get_int(key)) << key;
  }
  EXPECT_EQ(*ours.get_float("llama.attention.layer_norm_rms_epsilon"),
            *ref.get_float("llama.attention.layer_norm_rms_epsilon"));
  EXPECT_EQ(*ours.get_int("llama.context_length"), 512);
  EXPECT_EQ(*ours.get_string(names::kName), "stories260K");

  // The file loads as a model.
  auto config = ModelConfig::from_gguf(ours);
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_TRUE(config->tied_output);
  EXPECT_EQ(config->context_length, 512);
  auto weights = LlamaWeights::bind(ours, *config);
  EXPECT_TRUE(weights.ok()) << weights.status().message();
}

// Reads the llama2.c file section by section, independently of the converter's layout code.
TEST(Llama2cConverterShared, AidreamsMhaShapesMetadataAndValues) {
  KVLM_REQUIRE_SHARED(checkpoint, "aidreams260K.bin");
  KVLM_REQUIRE_SHARED(tokenizer, "aidreams_tok512.bin");
  const fs::path out = testing::scratch_dir("AidreamsMhaShapesMetadataAndValues") / "aidreams.gguf";
  const Status s = convert_llama2c({checkpoint.string(), tokenizer.string(), out.string(), "", GgmlType::kF32});
  ASSERT_TRUE(s.ok()) << s.message();
  auto file = GgufFile::open(out.string());
  ASSERT_TRUE(file.ok()) << file.status().message();
  const GgufFile& f = **file;

  EXPECT_EQ(*f.get_int("llama.embedding_length"), 64);
  EXPECT_EQ(*f.get_int("llama.feed_forward_length"), 172);
  EXPECT_EQ(*f.get_int("llama.block_count"), 4);
  EXPECT_EQ(*f.get_int("llama.attention.head_count"), 4);
  EXPECT_EQ(*f.get_int("llama.attention.head_count_kv"), 4);
  EXPECT_EQ(*f.get_int("llama.context_length"), 128);
  EXPECT_EQ(*f.get_int("llama.rope.dimension_count"), 16);
  EXPECT_EQ(*f.get_int("llama.vocab_size"), 512);
  EXPECT_EQ(f.get_string_array(names::kTokTokens)->size(), 512u);
  EXPECT_EQ(f.find_tensor(names::kOutput), nullptr);  // positive vocab_size: shared classifier

  const std::vector<uint8_t> raw = testing::read_bytes(checkpoint);
  size_t at = 28;
  auto next = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    std::memcpy(v.data(), raw.data() + at, static_cast<size_t>(n) * 4);
    at += static_cast<size_t>(n) * 4;
    return v;
  };
  const int64_t dim = 64, hidden = 172, layers = 4, vocab = 512;
  auto expect_layers = [&](const char* name, int64_t rows, int64_t cols) {
    for (int l = 0; l < layers; ++l) {
      const GgufTensorInfo* t = f.find_tensor(names::blk(l, name));
      ASSERT_NE(t, nullptr) << names::blk(l, name);
      const std::vector<int64_t> dims = rows == 1 ? std::vector<int64_t>{cols} : std::vector<int64_t>{cols, rows};
      EXPECT_EQ(t->dims, dims);
      EXPECT_EQ(count_bit_differences(tensor_floats(*t), next(rows * cols)), 0) << names::blk(l, name);
    }
  };
  EXPECT_EQ(count_bit_differences(tensor_floats(*f.find_tensor(names::kTokenEmbd)), next(vocab * dim)), 0);
  expect_layers(names::kAttnNorm, 1, dim);
  expect_layers(names::kAttnQ, dim, dim);
  expect_layers(names::kAttnK, dim, dim);
  expect_layers(names::kAttnV, dim, dim);
  expect_layers(names::kAttnOutput, dim, dim);
  expect_layers(names::kFfnNorm, 1, dim);
  expect_layers(names::kFfnGate, hidden, dim);
  expect_layers(names::kFfnDown, dim, hidden);
  expect_layers(names::kFfnUp, hidden, dim);
  EXPECT_EQ(count_bit_differences(tensor_floats(*f.find_tensor(names::kOutputNorm)), next(dim)), 0);
  EXPECT_EQ(raw.size() - at, static_cast<size_t>(128 * 16 * 4));  // only the freq_cis tables remain

  auto config = ModelConfig::from_gguf(f);
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->attention_kind(), "MHA");
  EXPECT_TRUE(LlamaWeights::bind(f, *config).ok());
}

// Matrices whose rows fill whole blocks are quantized; others (ffn_down's 172) stay f32.
TEST(Llama2cConverterShared, Q8_0ConversionStaysWithinQuantizationError) {
  KVLM_REQUIRE_SHARED(checkpoint, "stories260K.bin");
  KVLM_REQUIRE_SHARED(tokenizer, "tok512.bin");
  const fs::path dir = testing::scratch_dir("Q8_0ConversionStaysWithinQuantizationError");
  ASSERT_TRUE(convert_llama2c({checkpoint.string(), tokenizer.string(), (dir / "f32.gguf").string(), "",
                               GgmlType::kF32})
                  .ok());
  const Status s =
      convert_llama2c({checkpoint.string(), tokenizer.string(), (dir / "q8.gguf").string(), "", GgmlType::kQ8_0});
  ASSERT_TRUE(s.ok()) << s.message();
  auto f32 = GgufFile::open((dir / "f32.gguf").string());
  auto q8 = GgufFile::open((dir / "q8.gguf").string());
  ASSERT_TRUE(f32.ok() && q8.ok());
  EXPECT_EQ(*(*q8)->get_int(names::kFileType), 7);
  for (const GgufTensorInfo& t : (*q8)->tensors()) {
    const GgufTensorInfo* ref = (*f32)->find_tensor(t.name);
    ASSERT_NE(ref, nullptr);
    const bool quantizable = t.dims.size() == 2 && t.dims[0] % 32 == 0;
    EXPECT_EQ(t.type, quantizable ? GgmlType::kQ8_0 : GgmlType::kF32) << t.name;
    const std::vector<float> exact = tensor_floats(*ref);
    const std::vector<float> approx = tensor_floats(t);
    ASSERT_EQ(exact.size(), approx.size());
    // Per 32-block: |error| <= d/2 for d = amax/127, plus f16 rounding of d (relative 2^-11 of amax).
    for (size_t b = 0; b < exact.size(); b += 32) {
      float amax = 0;
      for (size_t i = b; i < std::min(exact.size(), b + 32); ++i) amax = std::max(amax, std::fabs(exact[i]));
      const float tol = quantizable ? amax / 127.0f * 0.5f + amax * 1e-3f : 0.0f;
      for (size_t i = b; i < std::min(exact.size(), b + 32); ++i) {
        ASSERT_LE(std::fabs(exact[i] - approx[i]), tol) << t.name << " element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace kvlm
