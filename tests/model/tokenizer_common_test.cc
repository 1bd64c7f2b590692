// Tokenizer::create validation, UTF-8 helpers and special-token matching.
#include <gtest/gtest.h>

#include "model/tokenizer.h"
#include "model/tokenizer_special_matcher.h"
#include "model/unicode_utf8.h"

namespace kvlm {
namespace {

TokenizerVocab small_spm_vocab() {
  TokenizerVocab vocab;
  vocab.model = "llama";
  vocab.tokens = {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b", "\xE2\x96\x81" "a", "ab"};
  vocab.scores = {0, 0, 0, -1, -2, -3, -4, -5};
  vocab.unk_id = 0;
  vocab.bos_id = 1;
  vocab.eos_id = 2;
  return vocab;
}

void expect_error(TokenizerVocab vocab, const std::string& needle) {
  auto tokenizer = Tokenizer::create(std::move(vocab));
  ASSERT_FALSE(tokenizer.ok()) << "expected an error mentioning " << needle;
  EXPECT_NE(tokenizer.status().message().find(needle), std::string::npos) << tokenizer.status().message();
}

TEST(TokenizerCreateTest, RejectsBadVocabularies) {
  TokenizerVocab vocab = small_spm_vocab();
  vocab.model = "bert";
  expect_error(vocab, "'bert'");

  vocab = small_spm_vocab();
  vocab.tokens.clear();
  vocab.scores.clear();
  expect_error(vocab, "no tokens");

  vocab = small_spm_vocab();
  vocab.scores.pop_back();
  expect_error(vocab, "7 scores for 8 tokens");

  vocab = small_spm_vocab();
  vocab.token_types = {1, 1, 1};
  expect_error(vocab, "3 token types for 8 tokens");

  vocab = small_spm_vocab();
  vocab.token_types.assign(8, 1);
  vocab.token_types[5] = 9;
  expect_error(vocab, "token 5 ('b') has token type 9");

  vocab = small_spm_vocab();
  vocab.bos_id = 8;
  expect_error(vocab, "bos_id 8");
  vocab = small_spm_vocab();
  vocab.eos_id = -2;
  expect_error(vocab, "eos_id -2");
  vocab = small_spm_vocab();
  vocab.pad_id = 100;
  expect_error(vocab, "pad_id 100");

  TokenizerVocab bpe;
  bpe.model = "gpt2";
  bpe.pre = "gpt2";
  bpe.tokens = {"a", "b", "ab"};
  bpe.merges = {"a b", "ab"};
  expect_error(bpe, "merge 1 ('ab')");
}

TEST(TokenizerCreateTest, InfersTokenTypesAndEncodesSmallSpm) {
  TokenizerVocab vocab = small_spm_vocab();
  vocab.tokens.push_back("<0x21>");  // '!' as a byte-fallback token
  vocab.scores.push_back(0);
  auto created = Tokenizer::create(vocab);
  ASSERT_TRUE(created.ok()) << created.status().message();
  const Tokenizer& t = **created;
  EXPECT_EQ(t.token_type(0), TokenType::kUnknown);
  EXPECT_EQ(t.token_type(1), TokenType::kControl);
  EXPECT_EQ(t.token_type(2), TokenType::kControl);
  EXPECT_EQ(t.token_type(4), TokenType::kNormal);
  EXPECT_EQ(t.token_type(8), TokenType::kByte);
  EXPECT_EQ(t.vocab().token_types.size(), 9u);
  EXPECT_EQ(t.find_token("ab"), std::optional<TokenId>(7));
  EXPECT_EQ(t.find_token("zz"), std::nullopt);
  // Bytes with a fallback: '!' (<0x21>), and 'a', 'b', which are pieces of their own.
  ASSERT_EQ(t.warnings().size(), 1u);
  EXPECT_NE(t.warnings()[0].find("253 of 256"), std::string::npos) << t.warnings()[0];

  // "▁ab": "▁a" (score -4) and "ab" (-5) compete; the higher score wins, leaving "b".
  EXPECT_EQ(t.encode("ab", true), (std::vector<TokenId>{1, 6, 5}));
  // "b a": "▁b" is no token, so "▁" stays alone; then "▁a".
  EXPECT_EQ(t.encode("b a", false), (std::vector<TokenId>{3, 5, 6}));
  // '!' falls back to its byte token; 'z' has none and becomes <unk>.
  EXPECT_EQ(t.encode("a!z", false), (std::vector<TokenId>{6, 8, 0}));
  EXPECT_EQ(t.decode({1, 6, 8}), "a!");
}

TEST(TokenizerCreateTest, EqualScoresMergeLeftmostFirst) {
  TokenizerVocab vocab;
  vocab.model = "llama";
  vocab.add_space_prefix = false;
  vocab.tokens = {"a", "aa"};
  vocab.scores = {0, 0};
  auto t = Tokenizer::create(vocab);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ((*t)->encode("aaa", false), (std::vector<TokenId>{1, 0}));
  EXPECT_EQ((*t)->encode("aaaa", false), (std::vector<TokenId>{1, 1}));
}

TEST(Utf8Test, SequenceLengthAcceptsOnlyWellFormedSequences) {
  EXPECT_EQ(utf8_sequence_length("a", 0), 1u);
  EXPECT_EQ(utf8_sequence_length("\xC3\xA9", 0), 2u);          // é
  EXPECT_EQ(utf8_sequence_length("\xE4\xB8\xAD", 0), 3u);      // 中
  EXPECT_EQ(utf8_sequence_length("\xF0\x9F\x98\x80", 0), 4u);  // 😀
  EXPECT_EQ(utf8_sequence_length("\x80", 0), 0u);              // stray continuation
  EXPECT_EQ(utf8_sequence_length("\xC0\x80", 0), 0u);          // overlong NUL
  EXPECT_EQ(utf8_sequence_length("\xE0\x80\x80", 0), 0u);      // overlong
  EXPECT_EQ(utf8_sequence_length("\xED\xA0\x80", 0), 0u);      // surrogate U+D800
  EXPECT_EQ(utf8_sequence_length("\xF4\x90\x80\x80", 0), 0u);  // above U+10FFFF
  EXPECT_EQ(utf8_sequence_length("\xE4\xB8", 0), 0u);          // truncated
  EXPECT_EQ(utf8_sequence_length("\xE4" "a" "\xAD", 0), 0u);   // interrupted
  EXPECT_EQ(utf8_sequence_length("\xFF", 0), 0u);
  EXPECT_TRUE(is_valid_utf8("héllo 中文 😀"));
  EXPECT_FALSE(is_valid_utf8("ok\xFF"));

  // Every scalar value survives encode -> length -> decode.
  for (char32_t cp = 0; cp <= 0x10FFFF; cp += (cp < 0x3000 ? 1 : 97)) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    std::string s;
    append_utf8(cp, &s);
    const size_t length = utf8_sequence_length(s, 0);
    ASSERT_EQ(length, s.size()) << static_cast<uint32_t>(cp);
    ASSERT_EQ(utf8_decode(s, 0, length), cp);
  }
}

TEST(SpecialTokenMatcherTest, FindsLeftmostThenLongest) {
  SpecialTokenMatcher matcher;
  EXPECT_TRUE(matcher.empty());
  EXPECT_EQ(matcher.find_next("abc", 0).length, 0u);
  matcher.add("<s>", 1);
  matcher.add("<s>x", 2);
  matcher.add("bcd", 3);
  matcher.add("", 4);  // ignored
  EXPECT_FALSE(matcher.empty());

  auto m = matcher.find_next("a<s>xy", 0);
  EXPECT_EQ(m.begin, 1u);
  EXPECT_EQ(m.length, 4u);
  EXPECT_EQ(m.id, 2);
  m = matcher.find_next("a<s>y<s", 0);
  EXPECT_EQ(m.begin, 1u);
  EXPECT_EQ(m.length, 3u);
  EXPECT_EQ(m.id, 1);
  m = matcher.find_next("a<s>y<s", 4);  // a prefix of a token at the end is no match
  EXPECT_EQ(m.length, 0u);
  EXPECT_EQ(m.begin, 7u);
  m = matcher.find_next("abcd", 0);  // "bcd" starts at 1
  EXPECT_EQ(m.begin, 1u);
  EXPECT_EQ(m.id, 3);
  matcher.add("<s>", 9);  // replaces
  EXPECT_EQ(matcher.find_next("<s>", 0).id, 9);
}

}  // namespace
}  // namespace kvlm
