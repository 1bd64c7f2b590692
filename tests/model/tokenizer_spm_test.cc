// SentencePiece-style tokenizer against the real stories260K vocabulary (tok512.bin) and a plain reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <sstream>

#include "model/tokenizer.h"
#include "model/tokenizer_test_util.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

using testing::read_file_bytes;
using testing::read_llama2c_vocab;
using testing::readme_story;
using testing::reference_spm_encode;

constexpr int kTok512Size = 512;

std::unique_ptr<Tokenizer> make_tok512(const std::filesystem::path& path) {
  auto vocab = read_llama2c_vocab(path, kTok512Size);
  EXPECT_TRUE(vocab.ok()) << vocab.status().message();
  if (!vocab.ok()) return nullptr;
  auto tokenizer = Tokenizer::create(std::move(vocab).value());
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  return tokenizer.ok() ? std::move(tokenizer).value() : nullptr;
}

std::vector<std::string> lines_of(const std::string& text, size_t max_lines) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (lines.size() < max_lines && std::getline(in, line)) lines.push_back(line);
  return lines;
}

TEST(SpmTokenizerTest, ReadmeStoryMatchesGreedyIdsAndRoundTrips) {
  KVLM_REQUIRE_SHARED(tok_path, "tok512.bin");
  KVLM_REQUIRE_SHARED(readme_path, "README.md");
  auto tokenizer = make_tok512(tok_path);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_TRUE(tokenizer->warnings().empty());
  const std::string story = readme_story(readme_path);
  ASSERT_TRUE(story.starts_with("Once upon a time, there was a little girl named Lily.")) << story;
  ASSERT_TRUE(story.ends_with("so she")) << story;

  const std::vector<TokenId> ids = tokenizer->encode(story, /*add_bos=*/true);
  // The ids stories260K generated greedily from BOS (README), i.e. what its trainer's tokenizer produced.
  const std::vector<TokenId> expected_prefix = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421};
  ASSERT_GE(ids.size(), expected_prefix.size());
  EXPECT_EQ(std::vector<TokenId>(ids.begin(), ids.begin() + expected_prefix.size()), expected_prefix);
  EXPECT_EQ(ids, reference_spm_encode(tokenizer->vocab(), story, true));
  EXPECT_EQ(tokenizer->decode(ids), story);
  // 13 is the byte token <0x0A>: the story's three newlines have no merged piece.
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 13), 3);
}

TEST(SpmTokenizerTest, TinyStoriesLinesMatchReferenceAndRoundTrip) {
  KVLM_REQUIRE_SHARED(tok_path, "tok512.bin");
  KVLM_REQUIRE_SHARED(text_path, "tinystories_valid_head.txt");
  auto tokenizer = make_tok512(tok_path);
  ASSERT_NE(tokenizer, nullptr);
  const std::vector<std::string> lines = lines_of(read_file_bytes(text_path), 400);
  ASSERT_GE(lines.size(), 100u);
  for (const std::string& line : lines) {
    for (const bool add_bos : {true, false}) {
      const std::vector<TokenId> ids = tokenizer->encode(line, add_bos);
      ASSERT_EQ(ids, reference_spm_encode(tokenizer->vocab(), line, add_bos)) << line;
      ASSERT_EQ(tokenizer->decode(ids), line);
    }
  }
}

TEST(SpmTokenizerTest, WholeEvaluationFileRoundTrips) {
  KVLM_REQUIRE_SHARED(tok_path, "tok512.bin");
  KVLM_REQUIRE_SHARED(text_path, "tinystories_valid_head.txt");
  auto tokenizer = make_tok512(tok_path);
  ASSERT_NE(tokenizer, nullptr);
  const std::string text = read_file_bytes(text_path);
  ASSERT_GT(text.size(), 100000u);
  const std::vector<TokenId> ids = tokenizer->encode(text, true);
  // tok512 averages well over one byte per token on English text; guards against a
  // silent fall back to bytes everywhere.
  EXPECT_LT(ids.size(), text.size() / 2);
  EXPECT_EQ(tokenizer->decode(ids), text);
}

TEST(SpmTokenizerTest, UnicodeAndBytesOutsideTheVocabularyUseByteFallback) {
  KVLM_REQUIRE_SHARED(tok_path, "tok512.bin");
  auto tokenizer = make_tok512(tok_path);
  ASSERT_NE(tokenizer, nullptr);
  const std::optional<TokenId> space = tokenizer->find_token("\xE2\x96\x81");
  ASSERT_TRUE(space.has_value());

  // U+1F600 (F0 9F 98 80) is not in a 512-token vocabulary: dummy prefix, then its 4 bytes.
  EXPECT_EQ(tokenizer->encode("\xF0\x9F\x98\x80", false),
            (std::vector<TokenId>{*space, 3 + 0xF0, 3 + 0x9F, 3 + 0x98, 3 + 0x80}));
  // Invalid UTF-8: a stray continuation byte and a truncated sequence, byte by byte.
  EXPECT_EQ(tokenizer->encode("\x80\xE2\x96", false), (std::vector<TokenId>{*space, 3 + 0x80, 3 + 0xE2, 3 + 0x96}));

  const std::vector<std::string> samples = {
      "naïve café, 中文 and 😀 emoji", "tabs\tand\r\nCRLF\n", "  two leading spaces", "trailing spaces   ",
      "\x80\xFF\xFE raw \xC3 bytes \xED\xA0\x80 surrogate", "a", " ", "\n", "<s> and </s> as text"};
  for (const std::string& sample : samples) {
    const std::vector<TokenId> ids = tokenizer->encode(sample, true);
    EXPECT_EQ(ids, reference_spm_encode(tokenizer->vocab(), sample, true)) << sample;
    EXPECT_EQ(tokenizer->decode(ids), sample);
  }
  // Plain text never produces control tokens.
  const std::vector<TokenId> ids = tokenizer->encode("<s> and </s> as text", false);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1) + std::count(ids.begin(), ids.end(), 2), 0);
}

TEST(SpmTokenizerTest, RandomByteStringsRoundTrip) {
  KVLM_REQUIRE_SHARED(tok_path, "tok512.bin");
  auto tokenizer = make_tok512(tok_path);
  ASSERT_NE(tokenizer, nullptr);
  std::mt19937 rng(1234);
  const std::string alphabet = "abcdefghijklmnopqrstuvwxyz     ,.!?'\"\n";
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text(rng() % 48, '\0');
    for (char& c : text) {
      // Mostly text-like bytes, so merges happen, with arbitrary bytes mixed in.
      c = rng() % 4 == 0 ? static_cast<char>(rng() % 256) : alphabet[rng() % alphabet.size()];
    }
    const std::vector<TokenId> ids = tokenizer->encode(text, trial % 2 == 0);
    ASSERT_EQ(ids, reference_spm_encode(tokenizer->vocab(), text, trial % 2 == 0)) << trial;
    ASSERT_EQ(tokenizer->decode(ids), text) << trial;
  }
}

TEST(SpmTokenizerTest, PiecesAndDecodeSpaceHandling) {
  KVLM_REQUIRE_SHARED(tok_path, "tok512.bin");
  auto tokenizer = make_tok512(tok_path);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->vocab_size(), kTok512Size);
  EXPECT_EQ(tokenizer->bos_id(), 1);
  EXPECT_EQ(tokenizer->eos_id(), 2);
  EXPECT_TRUE(tokenizer->add_bos());
  EXPECT_EQ(tokenizer->token_to_piece(403), " Once");
  EXPECT_EQ(tokenizer->token_to_piece(13), "\n");
  EXPECT_EQ(tokenizer->token_to_piece(3 + 0xE2), "\xE2");
  EXPECT_EQ(tokenizer->token_to_piece(1), "");
  EXPECT_EQ(tokenizer->token_to_piece(2), "");
  EXPECT_EQ(tokenizer->token_to_piece(0), "");  // <unk>
  EXPECT_EQ(tokenizer->token_to_piece(-1), "");
  EXPECT_EQ(tokenizer->token_to_piece(kTok512Size), "");

  // Only the space of the first printed token (after BOS) is the dummy prefix.
  EXPECT_EQ(tokenizer->decode({1, 403, 407}), "Once upon");
  EXPECT_EQ(tokenizer->decode({403, 407}), "Once upon");
  EXPECT_EQ(tokenizer->decode({1, 403, 2, 1, 407}), "Once upon");
  EXPECT_EQ(tokenizer->decode({}), "");

  EXPECT_EQ(tokenizer->encode("", true), std::vector<TokenId>{1});
  EXPECT_TRUE(tokenizer->encode("", false).empty());
  EXPECT_EQ(tokenizer->encode("Once upon", true), (std::vector<TokenId>{1, 403, 407}));
}

TEST(SpmTokenizerTest, NoSpacePrefixWhenTheVocabularySaysSo) {
  KVLM_REQUIRE_SHARED(tok_path, "tok512.bin");
  auto vocab = read_llama2c_vocab(tok_path, kTok512Size);
  ASSERT_TRUE(vocab.ok()) << vocab.status().message();
  vocab->add_space_prefix = false;
  auto tokenizer = Tokenizer::create(*vocab);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  const std::vector<TokenId> with_space = (*tokenizer)->encode(" Once upon", false);
  EXPECT_EQ(with_space, (std::vector<TokenId>{403, 407}));
  EXPECT_EQ((*tokenizer)->decode(with_space), " Once upon");
  const std::vector<TokenId> ids = (*tokenizer)->encode("Once", false);
  EXPECT_EQ(ids, reference_spm_encode(*vocab, "Once", false));
  EXPECT_EQ((*tokenizer)->decode(ids), "Once");
}

TEST(SpmTokenizerTest, ParseSpecialSplitsControlTokensAndReaddsThePrefix) {
  KVLM_REQUIRE_SHARED(tok_path, "tok512.bin");
  auto tokenizer = make_tok512(tok_path);
  ASSERT_NE(tokenizer, nullptr);
  const std::vector<TokenId> once_upon = tokenizer->encode("Once upon", false);
  std::vector<TokenId> expected = once_upon;
  expected.push_back(2);
  expected.push_back(1);
  expected.insert(expected.end(), once_upon.begin(), once_upon.end());  // dummy prefix again after <s>
  EXPECT_EQ(tokenizer->encode("Once upon</s><s>Once upon", false, SpecialTokens::kParse), expected);
  // As text, the same input contains neither control id.
  const std::vector<TokenId> as_text = tokenizer->encode("Once upon</s><s>Once upon", false);
  EXPECT_EQ(std::count(as_text.begin(), as_text.end(), 1) + std::count(as_text.begin(), as_text.end(), 2), 0);
  EXPECT_EQ(tokenizer->decode(as_text), "Once upon</s><s>Once upon");
  // "<unk>" is split out too, like llama.cpp's parse_special.
  EXPECT_EQ(tokenizer->encode("<unk>", false, SpecialTokens::kParse), std::vector<TokenId>{0});
}

// Pieces that span "▁" and newlines in the middle (unlike tok512) make the encoder's
// segment cuts rarer; results must still equal the whole-text reference merge.
TEST(SpmTokenizerTest, PiecesAcrossSpacesAndNewlinesMatchReference) {
  TokenizerVocab vocab;
  vocab.model = "llama";
  vocab.tokens = {"<unk>", "<s>", "</s>"};
  for (int b = 0; b < 256; ++b) vocab.tokens.push_back(fmt::format("<0x{:02X}>", b));
  const std::string s = "\xE2\x96\x81";  // "▁"
  for (const std::string& piece : {s, std::string("a"), std::string("b"), std::string("\n"), s + "a", "a" + s,
                                   "a" + s + "b", std::string("b\n"), std::string("\n\n"), s + s, std::string("ab"),
                                   std::string("ba"), s + "a" + s, "\n" + s}) {
    vocab.tokens.push_back(piece);
  }
  vocab.scores.assign(vocab.tokens.size(), 0.0f);
  std::mt19937 rng(7);
  for (size_t i = 3 + 256; i < vocab.scores.size(); ++i) vocab.scores[i] = -static_cast<float>(rng() % 5);
  vocab.unk_id = 0;
  vocab.bos_id = 1;
  vocab.eos_id = 2;
  auto created = Tokenizer::create(vocab);
  ASSERT_TRUE(created.ok()) << created.status().message();
  const Tokenizer& tokenizer = **created;
  const std::string alphabet = "ab  \nc";
  for (int trial = 0; trial < 3000; ++trial) {
    std::string text(rng() % 40, '\0');
    for (char& c : text) c = alphabet[rng() % alphabet.size()];
    const std::vector<TokenId> ids = tokenizer.encode(text, true);
    ASSERT_EQ(ids, reference_spm_encode(tokenizer.vocab(), text, true)) << trial;
    ASSERT_EQ(tokenizer.decode(ids), text) << trial;
  }
}

}  // namespace
}  // namespace kvlm

namespace kvlm {
namespace {

// Gemma's conventions on a hand-made vocabulary: no dummy prefix, newline runs and HTML tags
// as user-defined tokens (always whole, as Gemma's own encoder treats them), byte fallback.
TEST(SpmTokenizerTest, GemmaStyleUserDefinedTokensAreAlwaysWhole) {
  TokenizerVocab vocab;
  vocab.model = "llama";
  vocab.add_space_prefix = false;
  const auto add = [&](std::string text, TokenType type, float score) {
    vocab.tokens.push_back(std::move(text));
    vocab.token_types.push_back(static_cast<int32_t>(type));
    vocab.scores.push_back(score);
    return static_cast<TokenId>(vocab.tokens.size() - 1);
  };
  add("<pad>", TokenType::kControl, 0);
  const TokenId eos = add("<eos>", TokenType::kControl, 0);
  const TokenId bos = add("<bos>", TokenType::kControl, 0);
  vocab.unk_id = add("<unk>", TokenType::kUnknown, 0);
  const TokenId newline = add("\n", TokenType::kUserDefined, 0);
  const TokenId two_newlines = add("\n\n", TokenType::kUserDefined, 0);
  const TokenId table = add("<table>", TokenType::kUserDefined, 0);
  const TokenId first_byte = static_cast<TokenId>(vocab.tokens.size());
  for (int b = 0; b < 256; ++b) add(fmt::format("<0x{:02X}>", b), TokenType::kByte, 0);
  const TokenId a = add("a", TokenType::kNormal, -1), b = add("b", TokenType::kNormal, -2);
  const TokenId space = add("\xE2\x96\x81", TokenType::kNormal, -3);
  const TokenId ab = add("ab", TokenType::kNormal, -4), space_a = add("\xE2\x96\x81" "a", TokenType::kNormal, -5);
  vocab.bos_id = bos;
  vocab.eos_id = eos;
  auto created = Tokenizer::create(vocab);
  ASSERT_TRUE(created.ok()) << created.status().message();
  const Tokenizer& tok = **created;
  using Ids = std::vector<TokenId>;

  EXPECT_EQ(tok.encode("ab", false), (Ids{ab}));  // no "▁" in front
  EXPECT_EQ(tok.encode(" a b", false), (Ids{space_a, space, b}));
  EXPECT_EQ(tok.encode("a\n\n\nb", false), (Ids{a, two_newlines, newline, b}));  // longest first
  EXPECT_EQ(tok.encode("ab<table>a", false), (Ids{ab, table, a}));                 // as text, still whole
  EXPECT_EQ(tok.encode("<bos>", false, SpecialTokens::kParse), (Ids{bos}));
  const Ids as_text = tok.encode("<bos>", false);
  EXPECT_EQ(std::count(as_text.begin(), as_text.end(), bos), 0);
  EXPECT_EQ(tok.encode("é", false), (Ids{first_byte + 0xC3, first_byte + 0xA9}));  // byte fallback
  for (const char* text : {"ab", " a b", "a\n\n\nb", "ab<table>a", "<bos>", "é", "  \n a"}) {
    EXPECT_EQ(tok.decode(tok.encode(text, true)), text);  // nothing to strip without the prefix
  }
}

}  // namespace
}  // namespace kvlm
