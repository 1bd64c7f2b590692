// load_tokenizer_vocab: the stories260K GGUF vocabulary and synthetic GGUF metadata.
#include <gtest/gtest.h>

#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "model/tokenizer.h"
#include "model/tokenizer_gguf.h"
#include "model/tokenizer_test_util.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

Result<TokenizerVocab> load_from_writer(const GgufWriter& writer) {
  auto file = GgufFile::from_bytes(writer.to_bytes(), "synthetic.gguf");
  if (!file.ok()) return file.status();
  return load_tokenizer_vocab(**file);
}

TEST(TokenizerGgufTest, Stories260KMatchesTok512Vocabulary) {
  KVLM_REQUIRE_SHARED(gguf_path, "stories260K.gguf");
  KVLM_REQUIRE_SHARED(tok_path, "tok512.bin");
  KVLM_REQUIRE_SHARED(readme_path, "README.md");
  auto file = GgufFile::open(gguf_path.string());
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto vocab = load_tokenizer_vocab(**file);
  ASSERT_TRUE(vocab.ok()) << vocab.status().message();
  EXPECT_EQ(vocab->model, "llama");
  EXPECT_EQ(vocab->bos_id, 1);
  EXPECT_EQ(vocab->eos_id, 2);
  EXPECT_EQ(vocab->unk_id, 0);
  EXPECT_EQ(vocab->pad_id, -1);  // stored as uint32 0xFFFFFFFF
  EXPECT_TRUE(vocab->add_bos);
  EXPECT_TRUE(vocab->add_space_prefix);

  auto reference = testing::read_llama2c_vocab(tok_path, 512);
  ASSERT_TRUE(reference.ok()) << reference.status().message();
  EXPECT_EQ(vocab->tokens, reference->tokens);
  EXPECT_EQ(vocab->scores, reference->scores);
  EXPECT_EQ(vocab->token_types, reference->token_types);

  auto from_gguf = Tokenizer::create(*vocab);
  auto from_bin = Tokenizer::create(*reference);
  ASSERT_TRUE(from_gguf.ok()) << from_gguf.status().message();
  ASSERT_TRUE(from_bin.ok()) << from_bin.status().message();
  const std::string story = testing::readme_story(readme_path);
  ASSERT_FALSE(story.empty());
  const std::vector<TokenId> ids = (*from_gguf)->encode(story, (*from_gguf)->add_bos());
  EXPECT_EQ(ids, (*from_bin)->encode(story, true));
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(std::vector<TokenId>(ids.begin(), ids.begin() + 4), (std::vector<TokenId>{1, 403, 407, 261}));
  EXPECT_EQ((*from_gguf)->decode(ids), story);
}

TEST(TokenizerGgufTest, BpeMetadataAndDefaults) {
  GgufWriter writer;
  writer.set_string("tokenizer.ggml.model", "gpt2");
  writer.set_string("tokenizer.ggml.pre", "qwen2");
  writer.set("tokenizer.ggml.tokens", GgufValue::string_array({"a", "b", "ab", "<|end|>"}));
  writer.set("tokenizer.ggml.token_type", GgufValue::i32_array({1, 1, 1, 3}));
  writer.set("tokenizer.ggml.merges", GgufValue::string_array({"a b"}));
  writer.set_u32("tokenizer.ggml.eos_token_id", 3);
  writer.set_u32("tokenizer.ggml.bos_token_id", 0xFFFFFFFFu);
  auto vocab = load_from_writer(writer);
  ASSERT_TRUE(vocab.ok()) << vocab.status().message();
  EXPECT_EQ(vocab->pre, "qwen2");
  EXPECT_EQ(vocab->merges, std::vector<std::string>{"a b"});
  EXPECT_EQ(vocab->token_types, (std::vector<int32_t>{1, 1, 1, 3}));
  EXPECT_TRUE(vocab->scores.empty());
  EXPECT_EQ(vocab->bos_id, -1);
  EXPECT_EQ(vocab->eos_id, 3);
  EXPECT_EQ(vocab->unk_id, -1);
  EXPECT_FALSE(vocab->add_bos);  // gpt2 default
  auto tokenizer = Tokenizer::create(*vocab);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  EXPECT_EQ((*tokenizer)->encode("abab", true), (std::vector<TokenId>{2, 2}));

  writer.set_string("tokenizer.ggml.pre", "llama-bpe");
  vocab = load_from_writer(writer);
  ASSERT_TRUE(vocab.ok()) << vocab.status().message();
  EXPECT_TRUE(vocab->add_bos);  // Llama 3 pre types default to BOS, as in llama.cpp
  writer.set_bool("tokenizer.ggml.add_bos_token", false);
  vocab = load_from_writer(writer);
  ASSERT_TRUE(vocab.ok()) << vocab.status().message();
  EXPECT_FALSE(vocab->add_bos);
}

TEST(TokenizerGgufTest, SpmDefaultsAndErrorsNameTheKey) {
  GgufWriter writer;
  writer.set_string("tokenizer.ggml.model", "llama");
  writer.set("tokenizer.ggml.tokens", GgufValue::string_array({"<unk>", "<s>", "</s>", "x"}));
  writer.set_bool("tokenizer.ggml.add_space_prefix", false);
  auto vocab = load_from_writer(writer);
  ASSERT_TRUE(vocab.ok()) << vocab.status().message();
  EXPECT_EQ(vocab->bos_id, 1);
  EXPECT_EQ(vocab->eos_id, 2);
  EXPECT_EQ(vocab->unk_id, 0);
  EXPECT_TRUE(vocab->add_bos);
  EXPECT_FALSE(vocab->add_space_prefix);
  EXPECT_TRUE(vocab->pre.empty());

  GgufWriter wrong_type = writer;
  wrong_type.set_u32("tokenizer.ggml.bos_token_id", 1);
  wrong_type.set_string("tokenizer.ggml.eos_token_id", "2");
  auto bad = load_from_writer(wrong_type);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tokenizer.ggml.eos_token_id"), std::string::npos) << bad.status().message();

  GgufWriter no_tokens;
  no_tokens.set_string("tokenizer.ggml.model", "llama");
  bad = load_from_writer(no_tokens);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tokenizer.ggml.tokens"), std::string::npos) << bad.status().message();

  GgufWriter no_model;
  bad = load_from_writer(no_model);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tokenizer.ggml.model"), std::string::npos) << bad.status().message();
}

}  // namespace
}  // namespace kvlm
