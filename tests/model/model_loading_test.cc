// Loading llama-family GGUF files: architecture variants, weight types, and clear errors.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>

#include <gtest/gtest.h>

#include "engine/generator.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "kv/kv_storage.h"
#include "model/llama2c_converter.h"
#include "model/llama_model.h"
#include "model/model_synthesizer.h"
#include "reference/reference_forward.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

std::string synth(const std::string& dir_name, const std::string& preset, GgmlType type = GgmlType::kF32) {
  const auto dir = testing::scratch_dir(dir_name);
  SynthOptions options;
  options.shape = *synth_preset(preset);
  options.weight_type = type;
  options.seed = 5;
  options.out_path = (dir / "model.gguf").string();
  EXPECT_TRUE(synthesize_model(options).ok());
  return options.out_path;
}

// Copies a GGUF file through `edit` (returns the key/value to write, or nullopt to drop it)
// and `keep_tensor`.
using KeyValueEdit = std::function<std::optional<GgufKeyValue>(const GgufKeyValue&)>;
std::string rewrite(const std::string& src, const std::string& dst, const KeyValueEdit& edit,
                    const std::function<bool(const std::string&)>& keep_tensor) {
  auto file = GgufFile::open(src);
  EXPECT_TRUE(file.ok()) << file.status().message();
  GgufWriter writer;
  for (const GgufKeyValue& kv : (*file)->metadata()) {
    if (auto edited = edit(kv)) writer.set(edited->key, edited->value);
  }
  for (const GgufTensorInfo& t : (*file)->tensors()) {
    if (!keep_tensor(t.name)) continue;
    writer.add_tensor(t.name, t.type, t.dims, std::vector<uint8_t>(t.data, t.data + t.num_bytes));
  }
  EXPECT_TRUE(writer.write(dst).ok());
  return dst;
}

std::optional<GgufKeyValue> same(const GgufKeyValue& kv) { return kv; }
bool all_tensors(const std::string&) { return true; }

// Renames "llama.*" keys to "<arch>.*"; with set_architecture also general.architecture.
KeyValueEdit rename_architecture(const std::string& arch, bool set_architecture) {
  return [=](const GgufKeyValue& kv) -> std::optional<GgufKeyValue> {
    if (kv.key == "general.architecture") {
      return set_architecture ? GgufKeyValue{kv.key, GgufValue::make_string(arch)} : kv;
    }
    if (kv.key.rfind("llama.", 0) == 0) return GgufKeyValue{arch + "." + kv.key.substr(6), kv.value};
    return kv;
  };
}

std::vector<float> logits_of(LlamaModel& model, const std::vector<TokenId>& tokens) {
  const KvLayout layout{model.config().num_layers, model.config().num_kv_heads, model.config().head_dim, 16};
  auto storage = KvStorage::create(layout, KvType::kF32, KvType::kF32, 4);
  EXPECT_TRUE(storage.ok());
  ThreadPool pool(1);
  std::vector<float> logits;
  const std::vector<int32_t> table{0, 1, 2, 3};
  model.forward(SequenceStep{tokens, 0, table, LogitsRows::kAll}, **storage, pool, logits);
  return logits;
}

TEST(ModelLoading, MistralArchitectureIsTheLlamaBlock) {
  const std::string llama = synth("load_mistral", "tiny-gqa");
  auto a = LlamaModel::load(llama);
  ASSERT_TRUE(a.ok()) << a.status().message();
  // Keys renamed but the architecture still says llama: the llama.* keys are missing.
  auto broken = LlamaModel::load(rewrite(llama, llama + ".broken.gguf", rename_architecture("mistral", false), all_tensors));
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.status().message().find("llama.block_count"), std::string::npos) << broken.status().message();
  // A consistent mistral file computes exactly what the llama file does.
  auto b = LlamaModel::load(rewrite(llama, llama + ".mistral.gguf", rename_architecture("mistral", true), all_tensors));
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ((*b)->config().architecture, "mistral");
  const std::vector<TokenId> tokens{1, 50, 60, 70};
  EXPECT_EQ(logits_of(**a, tokens), logits_of(**b, tokens));
}

TEST(ModelLoading, Qwen2HasBiasesAndNeoxRope) {
  auto model = LlamaModel::load(synth("load_qwen2", "qwen2-tiny"));
  ASSERT_TRUE(model.ok()) << model.status().message();
  EXPECT_TRUE((*model)->config().has_qkv_bias);
  EXPECT_EQ((*model)->config().rope.style, RopeStyle::kNeox);
  const std::vector<TokenId> tokens{1, 11, 22, 33, 44, 55, 66, 77, 88};
  const std::vector<float> got = logits_of(**model, tokens);
  const std::vector<double> want = reference_logits((*model)->config(), (*model)->weights(), tokens);
  EXPECT_LE(max_relative_error(got, want), 1e-4);
}

TEST(ModelLoading, UntiedOutputUsesOutputWeight) {
  auto model = LlamaModel::load(synth("load_untied", "tiny-untied"));
  ASSERT_TRUE(model.ok()) << model.status().message();
  EXPECT_FALSE((*model)->config().tied_output);
  EXPECT_NE((*model)->weights().output.data, (*model)->weights().token_embd.data);
  const std::vector<TokenId> tokens{1, 2, 3, 100, 200};
  EXPECT_LE(max_relative_error(logits_of(**model, tokens),
                               reference_logits((*model)->config(), (*model)->weights(), tokens)),
            1e-4);
}

// Weight types: F16/BF16 rows are exact in both paths; Q8_0/Q4_0 matmuls quantize the
// activations to 8 bits (as GGML does), which bounds the error at about 1% of the logits.
struct WeightCase {
  GgmlType type;
  double tolerance;
};

class WeightTypeTest : public ::testing::TestWithParam<WeightCase> {};

TEST_P(WeightTypeTest, ForwardMatchesReference) {
  const WeightCase c = GetParam();
  auto model = LlamaModel::load(synth(std::string("load_type_") + std::string(ggml_type_name(c.type)), "tiny-gqa", c.type));
  ASSERT_TRUE(model.ok()) << model.status().message();
  const std::vector<TokenId> tokens{1, 5, 9, 120, 250, 17, 3};
  EXPECT_LE(max_relative_error(logits_of(**model, tokens),
                               reference_logits((*model)->config(), (*model)->weights(), tokens)),
            c.tolerance);
}

INSTANTIATE_TEST_SUITE_P(Types, WeightTypeTest,
                         ::testing::Values(WeightCase{GgmlType::kF16, 1e-4}, WeightCase{GgmlType::kBF16, 1e-4},
                                           WeightCase{GgmlType::kQ8_0, 3e-2}, WeightCase{GgmlType::kQ4_0, 3e-2}),
                         [](const auto& info) { return std::string(ggml_type_name(info.param.type)); });

TEST(ModelLoading, UnknownArchitectureIsNamed) {
  const std::string src = synth("load_arch", "tiny-mha");
  auto model = LlamaModel::load(rewrite(src, src + ".gptj.gguf", rename_architecture("gptj", true), all_tensors));
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("'gptj' is not supported"), std::string::npos) << model.status().message();
}

TEST(ModelLoading, MissingTensorsAreAllListed) {
  const std::string src = synth("load_missing", "tiny-mha");
  const std::string dst = rewrite(
      src, src + ".missing.gguf", same,
      [](const std::string& name) { return name != "blk.0.attn_k.weight" && name != "blk.1.ffn_up.weight"; });
  auto model = LlamaModel::load(dst);
  ASSERT_FALSE(model.ok());
  const std::string& msg = model.status().message();
  EXPECT_NE(msg.find("missing tensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("blk.0.attn_k.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("blk.1.ffn_up.weight"), std::string::npos) << msg;
}

TEST(ModelLoading, MissingHyperParameterIsNamed) {
  const std::string src = synth("load_hparam", "tiny-mha");
  const std::string dst = rewrite(
      src, src + ".nohp.gguf",
      [](const GgufKeyValue& kv) -> std::optional<GgufKeyValue> {
        if (kv.key == "llama.embedding_length") return std::nullopt;
        return kv;
      },
      all_tensors);
  auto model = LlamaModel::load(dst);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("llama.embedding_length"), std::string::npos) << model.status().message();
}

}  // namespace
}  // namespace kvlm

namespace kvlm {
namespace {

// The GGUF kvlm converts from llama2.c and the llama.cpp-made GGUF must compute the same logits.
TEST(ModelLoading, ConvertedStories260KGivesIdenticalLogits) {
  KVLM_REQUIRE_SHARED(reference_path, "stories260K.gguf");
  KVLM_REQUIRE_SHARED(checkpoint, "stories260K.bin");
  KVLM_REQUIRE_SHARED(tokenizer, "tok512.bin");
  Llama2cConvertOptions options;
  options.checkpoint_path = checkpoint.string();
  options.tokenizer_path = tokenizer.string();
  options.out_path = (testing::scratch_dir("converted") / "stories260K.gguf").string();
  ASSERT_TRUE(convert_llama2c(options).ok());
  auto converted = LlamaModel::load(options.out_path);
  auto reference = LlamaModel::load(reference_path.string());
  ASSERT_TRUE(converted.ok()) << converted.status().message();
  ASSERT_TRUE(reference.ok()) << reference.status().message();
  const std::vector<TokenId> tokens = (*reference)->tokenizer().encode("Once upon a time, Lily saw a big dog.", true);
  EXPECT_EQ((*converted)->tokenizer().encode("Once upon a time, Lily saw a big dog.", true), tokens);
  EXPECT_EQ(logits_of(**converted, tokens), logits_of(**reference, tokens));
}

// The embedded default model loads from bytes in memory: the same model as from the file.
TEST(ModelLoading, Stories260KFromBytesEqualsFromThePath) {
  KVLM_REQUIRE_SHARED(path, "stories260K.gguf");
  auto from_path = LlamaModel::load(path.string());
  auto from_bytes = LlamaModel::load_from_bytes(testing::read_bytes(path), "stories260K (in memory)");
  ASSERT_TRUE(from_path.ok()) << from_path.status().message();
  ASSERT_TRUE(from_bytes.ok()) << from_bytes.status().message();
  const ModelConfig& a = (*from_path)->config();
  const ModelConfig& b = (*from_bytes)->config();
  EXPECT_EQ(b.architecture, a.architecture);
  EXPECT_EQ(b.name, a.name);
  EXPECT_EQ(std::tie(b.num_layers, b.dim, b.num_heads, b.num_kv_heads, b.head_dim, b.ffn_dim, b.vocab_size,
                     b.context_length, b.tied_output),
            std::tie(a.num_layers, a.dim, a.num_heads, a.num_kv_heads, a.head_dim, a.ffn_dim, a.vocab_size,
                     a.context_length, a.tied_output));
  EXPECT_EQ(b.rms_eps, a.rms_eps);
  EXPECT_EQ(b.rope.freq_base, a.rope.freq_base);
  EXPECT_EQ((*from_bytes)->file().file_size(), (*from_path)->file().file_size());
  EXPECT_EQ((*from_bytes)->file().name(), "stories260K (in memory)");
  const std::vector<TokenId> tokens = (*from_path)->tokenizer().encode("Once upon a time, Lily saw a big dog.", true);
  EXPECT_EQ((*from_bytes)->tokenizer().encode("Once upon a time, Lily saw a big dog.", true), tokens);
  EXPECT_EQ(logits_of(**from_bytes, tokens), logits_of(**from_path, tokens));
}

// Bad bytes are an error naming the source, as a bad file names its path.
TEST(ModelLoading, TruncatedBytesAreAnErrorWithTheName) {
  KVLM_REQUIRE_SHARED(path, "stories260K.gguf");
  std::vector<uint8_t> bytes = testing::read_bytes(path);
  bytes.resize(bytes.size() / 2);
  auto model = LlamaModel::load_from_bytes(std::move(bytes), "half a model");
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("half a model"), std::string::npos) << model.status().message();
}

}  // namespace
}  // namespace kvlm
