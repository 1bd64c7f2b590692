// chat_format_for_model: tiny GGUF files with and without tokenizer.chat_template, and the
// real stories260K (which has none).
#include <gtest/gtest.h>

#include "chat/chat_format.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "model/synthetic_vocab.h"
#include "model/token_type.h"
#include "model/tokenizer.h"
#include "model/tokenizer_gguf.h"
#include "support/test_paths.h"

namespace kvlm::chat {
namespace {

struct LoadedModel {
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<Tokenizer> tokenizer;
};

// A synthetic SPM vocabulary, plus `extra_tokens` as control tokens at the end.
LoadedModel make_model(const std::optional<std::string>& chat_template, const std::vector<std::string>& extra_tokens,
                       std::optional<int32_t> eot_id = std::nullopt) {
  auto vocab = make_synthetic_vocab(300);
  EXPECT_TRUE(vocab.ok());
  for (const std::string& t : extra_tokens) {
    vocab->tokens.push_back(t);
    vocab->scores.push_back(0.0f);
    vocab->token_types.push_back(static_cast<int32_t>(TokenType::kControl));
  }
  GgufWriter writer;
  writer.set_string("general.architecture", "llama");
  add_spm_vocab_metadata(writer, *vocab);
  if (chat_template) writer.set_string("tokenizer.chat_template", *chat_template);
  if (eot_id) writer.set_u32("tokenizer.ggml.eot_token_id", static_cast<uint32_t>(*eot_id));
  auto file = GgufFile::from_bytes(writer.to_bytes(), "tiny.gguf");
  EXPECT_TRUE(file.ok()) << file.status().message();
  auto loaded_vocab = load_tokenizer_vocab(**file);
  EXPECT_TRUE(loaded_vocab.ok()) << loaded_vocab.status().message();
  auto tokenizer = Tokenizer::create(*loaded_vocab);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  return {std::move(file).value(), std::move(tokenizer).value()};
}

const nlohmann::json kMessages = nlohmann::json::parse(R"([{"role":"user","content":"Hi"}])");

TEST(ChatFormatTest, MissingTemplateFallsBackToChatml) {
  LoadedModel m = make_model(std::nullopt, {});
  auto format = chat_format_for_model(*m.file, *m.tokenizer);
  ASSERT_TRUE(format.ok()) << format.status().message();
  EXPECT_TRUE(format->is_fallback);
  EXPECT_EQ(format->template_source, chatml_template_source());
  EXPECT_EQ(format->bos_token, "<s>");
  EXPECT_EQ(format->eos_token, "</s>");
  EXPECT_EQ(format->end_of_turn_tokens, std::vector<TokenId>{kSpmEosId});
  // <|im_end|> is not one token of this vocabulary: it becomes a stop string.
  EXPECT_EQ(format->end_of_turn_strings, std::vector<std::string>{"<|im_end|>"});
  auto prompt = format->render(kMessages, true);
  ASSERT_TRUE(prompt.ok()) << prompt.status().message();
  EXPECT_EQ(*prompt, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  auto no_prompt = format->render(kMessages, false);
  ASSERT_TRUE(no_prompt.ok());
  EXPECT_EQ(*no_prompt, "<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatFormatTest, ChatmlMarkerInVocabularyIsAnEndOfTurnToken) {
  LoadedModel m = make_model(std::nullopt, {"<|im_start|>", "<|im_end|>"});
  auto format = chat_format_for_model(*m.file, *m.tokenizer);
  ASSERT_TRUE(format.ok()) << format.status().message();
  const TokenId im_end = *m.tokenizer->find_token("<|im_end|>");
  EXPECT_EQ(format->end_of_turn_tokens, (std::vector<TokenId>{kSpmEosId, im_end}));
  EXPECT_TRUE(format->end_of_turn_strings.empty());
}

TEST(ChatFormatTest, StoredTemplateIsUsedWithEotTokenId) {
  const std::string source =
      "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
      "{{ m.content | trim }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant"
      "<|end_header_id|>\n\n{% endif %}";
  LoadedModel probe = make_model(source, {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom|>"});
  const TokenId eot = *probe.tokenizer->find_token("<|eot_id|>");
  const TokenId eom = *probe.tokenizer->find_token("<|eom|>");
  LoadedModel m = make_model(source, {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom|>"}, eom);
  auto format = chat_format_for_model(*m.file, *m.tokenizer);
  ASSERT_TRUE(format.ok()) << format.status().message();
  EXPECT_FALSE(format->is_fallback);
  EXPECT_EQ(format->template_source, source);
  EXPECT_EQ(format->end_of_turn_tokens, (std::vector<TokenId>{kSpmEosId, eom, eot}));
  EXPECT_TRUE(format->end_of_turn_strings.empty());
  auto prompt = format->render(kMessages, true);
  ASSERT_TRUE(prompt.ok()) << prompt.status().message();
  EXPECT_EQ(*prompt, "<s><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  // Extra context reaches the template; the standard keys come from the arguments.
  auto extra = ChatTemplate::parse("{{ tools | length }}{{ messages | length }}{{ add_generation_prompt }}");
  ASSERT_TRUE(extra.ok());
  ChatFormat custom = *format;
  custom.chat_template = *extra;
  auto with_extra = custom.render(kMessages, false, {{"tools", {1, 2}}, {"messages", "ignored"}});
  ASSERT_TRUE(with_extra.ok()) << with_extra.status().message();
  EXPECT_EQ(*with_extra, "21False");
}

TEST(ChatFormatTest, UnparsableTemplateIsAnError) {
  LoadedModel m = make_model(std::string("{% for m in messages %}{{ m.content }"), {});
  auto format = chat_format_for_model(*m.file, *m.tokenizer);
  ASSERT_FALSE(format.ok());
  EXPECT_NE(format.status().message().find("tokenizer.chat_template"), std::string::npos) << format.status().message();
  EXPECT_NE(format.status().message().find("line 1"), std::string::npos) << format.status().message();
}

TEST(ChatFormatTest, RenderErrorsAreStatuses) {
  LoadedModel m = make_model(std::string("{{ raise_exception('no system role') }}"), {});
  auto format = chat_format_for_model(*m.file, *m.tokenizer);
  ASSERT_TRUE(format.ok()) << format.status().message();
  auto prompt = format->render(kMessages, true);
  ASSERT_FALSE(prompt.ok());
  EXPECT_EQ(prompt.status().message(), "chat template raised an exception: no system role");
  EXPECT_FALSE(format->render(nlohmann::json::object(), true).ok());  // messages must be an array
}

TEST(ChatFormatTest, Stories260KHasNoTemplate) {
  KVLM_REQUIRE_SHARED(path, "stories260K.gguf");
  auto file = GgufFile::open(path.string());
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto vocab = load_tokenizer_vocab(**file);
  ASSERT_TRUE(vocab.ok()) << vocab.status().message();
  auto tokenizer = Tokenizer::create(*vocab);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  auto format = chat_format_for_model(**file, **tokenizer);
  ASSERT_TRUE(format.ok()) << format.status().message();
  EXPECT_TRUE(format->is_fallback);
  EXPECT_EQ(format->bos_token, "<s>");
  EXPECT_EQ(format->eos_token, "</s>");
  EXPECT_EQ(format->end_of_turn_tokens, std::vector<TokenId>{2});
  EXPECT_EQ(format->end_of_turn_strings, std::vector<std::string>{"<|im_end|>"});
}

}  // namespace
}  // namespace kvlm::chat
