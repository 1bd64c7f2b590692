// Reads the real stories260K.gguf (written by llama.cpp's converter) and re-writes it byte for byte.
#include <cmath>
#include <fstream>

#include <gtest/gtest.h>

#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

TEST(GgufStories, HeaderMetadataAndTensors) {
  KVLM_REQUIRE_SHARED(path, "stories260K.gguf");
  auto opened = GgufFile::open(path.string());
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  const GgufFile& f = *opened.value();
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.file_size(), 1185376u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.get_string("general.architecture").value(), "llama");
  EXPECT_EQ(f.get_int("llama.block_count").value(), 5);
  EXPECT_EQ(f.get_int("llama.embedding_length").value(), 64);
  EXPECT_EQ(f.get_int("llama.attention.head_count").value(), 8);
  EXPECT_EQ(f.get_int("llama.attention.head_count_kv").value(), 4);

  const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok()) << tokens.status().message();
  ASSERT_EQ(tokens.value().size(), 512u);
  EXPECT_EQ(tokens.value()[0], "<unk>");
  EXPECT_EQ(tokens.value()[13], "<0x0A>");  // byte tokens start at id 3
  EXPECT_EQ(f.get_float_array("tokenizer.ggml.scores").value().size(), 512u);
  EXPECT_EQ(f.find("tokenizer.ggml.tokens")->to_display_string(3), R"(["<unk>", "<s>", "</s>", ... (512 total)])");

  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->dims, (std::vector<int64_t>{64, 512}));
  EXPECT_EQ(embd->num_bytes, 64u * 512u * 4u);
  // 5 layers x 9 tensors, plus token_embd, output_norm and (untied here) output.
  EXPECT_GE(f.tensors().size(), 5u * 9u + 2u);
  for (const GgufTensorInfo& t : f.tensors()) {
    EXPECT_EQ(t.type, GgmlType::kF32) << t.name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 32, 0u) << t.name;
  }
  ASSERT_NE(f.find_tensor("blk.4.ffn_down.weight"), nullptr);
  EXPECT_EQ(f.find_tensor("blk.4.ffn_down.weight")->dims, (std::vector<int64_t>{172, 64}));
  EXPECT_EQ(f.find_tensor("blk.5.ffn_down.weight"), nullptr);

  // Weights are real numbers of a trained model: finite, not all zero.
  const auto* values = reinterpret_cast<const float*>(embd->data);
  double sum_sq = 0;
  for (int64_t i = 0; i < embd->num_elements(); ++i) {
    ASSERT_TRUE(std::isfinite(values[i])) << i;
    sum_sq += static_cast<double>(values[i]) * values[i];
  }
  EXPECT_GT(sum_sq, 1.0);
}

// Copying every key and tensor through the writer reproduces llama.cpp's file exactly: same layout,
// same padding, same encodings.
TEST(GgufStories, RewriteIsByteIdentical) {
  KVLM_REQUIRE_SHARED(path, "stories260K.gguf");
  auto opened = GgufFile::open(path.string());
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  const GgufFile& f = *opened.value();
  GgufWriter w;
  for (const GgufKeyValue& kv : f.metadata()) w.set(kv.key, kv.value);
  for (const GgufTensorInfo& t : f.tensors()) {
    w.add_tensor(t.name, t.type, t.dims, std::vector<uint8_t>(t.data, t.data + t.num_bytes));
  }
  const std::vector<uint8_t> rewritten = w.to_bytes();
  std::ifstream in(path, std::ios::binary);
  const std::vector<uint8_t> original((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(rewritten.size(), original.size());
  size_t first_difference = 0;
  while (first_difference < original.size() && original[first_difference] == rewritten[first_difference]) {
    ++first_difference;
  }
  EXPECT_EQ(first_difference, original.size()) << "first differing byte";
}

}  // namespace
}  // namespace kvlm
