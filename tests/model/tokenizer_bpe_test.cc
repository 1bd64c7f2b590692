// Byte-level BPE tokenizer on hand-made vocabularies: pre-tokenizer splits, merge order, bytes, round trips.
#include <gtest/gtest.h>

#include <random>
#include <unordered_map>

#include "model/bpe_pre_tokenizer.h"
#include "model/bpe_tokenizer.h"
#include "model/tokenizer.h"
#include "model/unicode_normalize.h"
#include "model/unicode_utf8.h"

namespace kvlm {
namespace {

using Ids = std::vector<TokenId>;
using Pieces = std::vector<std::string>;

// GPT-2's bytes_to_unicode, restated: printable Latin-1 bytes are themselves; the rest
// take U+0100, U+0101, ... in byte order (so ' ' = 0x20 is 'Ġ' U+0120, '\n' is 'Ċ' U+010A).
std::string byte_symbol(uint8_t byte) {
  char32_t next = 0x100;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const char32_t cp = printable ? static_cast<char32_t>(b) : next++;
    if (b == byte) {
      std::string out;
      append_utf8(cp, &out);
      return out;
    }
  }
  return {};
}

std::string byte_level(std::string_view bytes) {
  std::string out;
  for (const char c : bytes) out += byte_symbol(static_cast<uint8_t>(c));
  return out;
}

// Ids 0..255 are the byte symbols in byte order (id == byte value), then merged tokens
// in merge order, then a few tokens that no merge produces.
constexpr TokenId kTh = 256 + 14, kAa = 256 + 13;
constexpr TokenId kSpaceT = 256, kHe = 257, kSpaceThe = 258, kLl = 259, kApostropheLl = 260, k12 = 261, k123 = 262,
                  kTwoSpaces = 263, kDo = 264, kDon = 265, kApostropheT = 266, kTwoNewlines = 267, kEAcute = 268,
                  kLL = 256 + 15, kApostropheLL = 256 + 16;
constexpr TokenId kXyz = 256 + 17, kEot = 256 + 18, kTool = 256 + 19;

TokenizerVocab hand_vocab(std::string pre) {
  TokenizerVocab vocab;
  vocab.model = "gpt2";
  vocab.pre = std::move(pre);
  vocab.add_bos = false;
  for (int b = 0; b < 256; ++b) vocab.tokens.push_back(byte_symbol(static_cast<uint8_t>(b)));
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"l", "l"}, {"'", "ll"}, {"1", "2"},  {"12", "3"},  {"Ġ", "Ġ"},
      {"d", "o"}, {"do", "n"}, {"'", "t"},  {"Ċ", "Ċ"}, {"Ã", "©"},  {"a", "a"}, {"t", "h"},   {"L", "L"},
      {"'", "LL"}};
  for (const auto& [left, right] : merges) {
    vocab.merges.push_back(left + " " + right);
    vocab.tokens.push_back(left + right);
  }
  vocab.tokens.push_back("xyz");      // reachable by no merge: only "ignore merges" emits it
  vocab.tokens.push_back("<|eot|>");  // control
  vocab.tokens.push_back("<tool>");   // user-defined
  vocab.token_types.assign(vocab.tokens.size(), static_cast<int32_t>(TokenType::kNormal));
  vocab.token_types[kEot] = static_cast<int32_t>(TokenType::kControl);
  vocab.token_types[kTool] = static_cast<int32_t>(TokenType::kUserDefined);
  vocab.eos_id = kEot;
  return vocab;
}

std::unique_ptr<Tokenizer> make(std::string pre) {
  auto tokenizer = Tokenizer::create(hand_vocab(std::move(pre)));
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  return tokenizer.ok() ? std::move(tokenizer).value() : nullptr;
}

Pieces split(std::string_view pre_type, std::string_view text) {
  auto pre = BpePreTokenizer::create(pre_type, nullptr);
  EXPECT_TRUE(pre.ok()) << pre.status().message();
  if (!pre.ok()) return {};
  std::vector<std::string_view> views;
  pre->split(text, &views);
  return Pieces(views.begin(), views.end());
}

// Plain BPE on strings: rescan every adjacent pair, merge the lowest rank (leftmost on
// ties), repeat. Uses the tokenizer's own pre-tokenizer for the words; the user-defined
// "<tool>" is split out first, as always.
Ids reference_bpe_encode(const TokenizerVocab& vocab, const std::string& pre_type, std::string_view all_text) {
  std::unordered_map<std::string, TokenId> ids;
  for (size_t i = 0; i < vocab.tokens.size(); ++i) ids[vocab.tokens[i]] = static_cast<TokenId>(i);
  std::unordered_map<std::string, int> ranks;
  for (size_t r = 0; r < vocab.merges.size(); ++r) ranks.emplace(vocab.merges[r], static_cast<int>(r));
  auto pre = BpePreTokenizer::create(pre_type, nullptr);
  EXPECT_TRUE(pre.ok()) << pre.status().message();
  Ids out;
  std::vector<std::string> segments;
  for (size_t pos = 0; pos <= all_text.size();) {
    const size_t tool = all_text.find("<tool>", pos);
    const size_t length = tool == std::string_view::npos ? std::string_view::npos : tool - pos;
    const std::string_view segment = all_text.substr(pos, length);
    if (!segment.empty()) segments.emplace_back(segment);
    if (tool == std::string_view::npos) break;
    segments.emplace_back("<tool>");
    pos = tool + 6;
  }
  for (const std::string& segment : segments) {
    if (segment == "<tool>") {
      out.push_back(kTool);
      continue;
    }
    const std::string text =
        pre->normalization() == TextNormalization::kNfc ? nfc_normalize(segment) : segment;
  for (const std::string& word : split(pre_type, text)) {
    if (pre->ignore_merges() && ids.count(byte_level(word)) != 0) {
      out.push_back(ids.at(byte_level(word)));
      continue;
    }
    std::vector<std::string> symbols;
    for (const char c : word) symbols.push_back(byte_symbol(static_cast<uint8_t>(c)));
    while (true) {
      int best = -1, best_rank = 0;
      for (size_t i = 0; i + 1 < symbols.size(); ++i) {
        const auto it = ranks.find(symbols[i] + " " + symbols[i + 1]);
        if (it != ranks.end() && (best < 0 || it->second < best_rank)) {
          best = static_cast<int>(i);
          best_rank = it->second;
        }
      }
      if (best < 0) break;
      symbols[best] += symbols[best + 1];
      symbols.erase(symbols.begin() + best + 1);
    }
    for (const std::string& symbol : symbols) out.push_back(ids.at(symbol));
  }
  }
  return out;
}

TEST(BpePreTokenizerTest, Llama3Splits) {
  const auto pre = "llama3";
  EXPECT_EQ(split(pre, "Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(split(pre, "  leading"), (Pieces{" ", " leading"}));
  EXPECT_EQ(split(pre, "a   b"), (Pieces{"a", "  ", " b"}));
  EXPECT_EQ(split(pre, "trailing   "), (Pieces{"trailing", "   "}));
  EXPECT_EQ(split(pre, "12345"), (Pieces{"123", "45"}));
  EXPECT_EQ(split(pre, "x 12"), (Pieces{"x", " ", "12"}));
  EXPECT_EQ(split(pre, "don't"), (Pieces{"don", "'t"}));
  EXPECT_EQ(split(pre, "I'LL it's"), (Pieces{"I", "'LL", " it", "'s"}));
  EXPECT_EQ(split(pre, "Hi!!\n\nNext"), (Pieces{"Hi", "!!\n\n", "Next"}));
  EXPECT_EQ(split(pre, "a\n\n b"), (Pieces{"a", "\n\n", " b"}));
  EXPECT_EQ(split(pre, "héllo 中文 😀!"), (Pieces{"héllo", " 中文", " 😀!"}));
  EXPECT_EQ(split(pre, "$100 _foo x_y"), (Pieces{"$", "100", " _", "foo", " x", "_y"}));
  // An invalid byte behaves like punctuation (as U+FFFD would) but keeps its value.
  EXPECT_EQ(split(pre, "a\xFF" "b \x80"), (Pieces{"a", "\xFF" "b", " \x80"}));
  EXPECT_TRUE(split(pre, "").empty());
}

TEST(BpePreTokenizerTest, Qwen2SplitsDigitsSingly) {
  const auto pre = "qwen2";
  EXPECT_EQ(split(pre, "12345"), (Pieces{"1", "2", "3", "4", "5"}));
  EXPECT_EQ(split(pre, "I'LL don't"), (Pieces{"I", "'LL", " don", "'t"}));
  EXPECT_EQ(split(pre, "a\n\n b"), (Pieces{"a", "\n\n", " b"}));
}

TEST(BpePreTokenizerTest, Gpt2Splits) {
  const auto pre = "gpt2";
  EXPECT_EQ(split(pre, "12345 x 12"), (Pieces{"12345", " x", " 12"}));
  EXPECT_EQ(split(pre, "I'LL I'll"), (Pieces{"I", "'", "LL", " I", "'ll"}));  // lowercase contractions only
  EXPECT_EQ(split(pre, "a\n\nb"), (Pieces{"a", "\n", "\n", "b"}));
  EXPECT_EQ(split(pre, "  leading  trailing  "), (Pieces{" ", " leading", " ", " trailing", "  "}));
  EXPECT_EQ(split(pre, "$100"), (Pieces{"$", "100"}));
}

TEST(BpePreTokenizerTest, DeepSeekV3IsolatesDigitsAndCjkFirst) {
  const auto pre = "deepseek-v3";
  EXPECT_EQ(split(pre, "abc12345"), (Pieces{"abc", "123", "45"}));
  EXPECT_EQ(split(pre, "x中文y"), (Pieces{"x", "中文", "y"}));
  EXPECT_EQ(split(pre, "hello world.Next"), (Pieces{"hello", " world", ".Next"}));
  EXPECT_EQ(split(pre, "a\n\nb"), (Pieces{"a", "\n\n", "b"}));
}

TEST(BpePreTokenizerTest, Gpt4oAndTekkenSplitCaseRuns) {
  EXPECT_EQ(split("gpt-4o", "CamelCase HTTPServer"), (Pieces{"Camel", "Case", " HTTPServer"}));
  EXPECT_EQ(split("gpt-4o", "I'LL don't 12345"), (Pieces{"I'LL", " don't", " ", "123", "45"}));
  EXPECT_EQ(split("gpt-4o", "a/b//\n"), (Pieces{"a", "/b", "//\n"}));
  EXPECT_EQ(split("tekken", "don't 123"), (Pieces{"don", "'t", " ", "1", "2", "3"}));
}

TEST(BpePreTokenizerTest, SmolLmSplitsDigitsThenGpt2) {
  EXPECT_EQ(split("smollm", "ab 123 cd"), (Pieces{"ab", " ", "1", "2", "3", " cd"}));
}

TEST(BpePreTokenizerTest, Qwen2NormalizesToNfcOthersDoNot) {
  auto qwen2 = BpePreTokenizer::create("qwen2", nullptr);
  auto llama3 = BpePreTokenizer::create("llama-bpe", nullptr);
  ASSERT_TRUE(qwen2.ok() && llama3.ok());
  EXPECT_EQ(qwen2->normalization(), TextNormalization::kNfc);
  EXPECT_EQ(llama3->normalization(), TextNormalization::kNone);
  EXPECT_EQ(nfc_normalize("cafe\u0301"), "caf\u00e9");
  EXPECT_EQ(nfc_normalize("\u1100\u1161\u11a8"), "\uac01");          // Hangul jamo -> syllable
  EXPECT_EQ(nfc_normalize("e\u0301\xFF\u0301"), "\u00e9\xFF\u0301");  // invalid bytes kept, runs normalized
  EXPECT_TRUE(is_nfc("plain ascii"));
  EXPECT_FALSE(is_nfc("cafe\u0301"));
}

TEST(BpeTokenizerTest, MergesApplyLowestRankFirstLeftmostOnTies) {
  for (const char* pre : {"llama3", "qwen2", "gpt2"}) {
    auto tokenizer = make(pre);
    ASSERT_NE(tokenizer, nullptr);
    EXPECT_TRUE(tokenizer->warnings().empty()) << pre;
    // "the": h+e (rank 1) beats t+h (rank 14), and "t"+"he" is no merge.
    EXPECT_EQ(tokenizer->encode("the", false), (Ids{'t', kHe})) << pre;
    // " the": Ġ+t (rank 0), h+e (1), then Ġt+he (2).
    EXPECT_EQ(tokenizer->encode(" the", false), (Ids{kSpaceThe})) << pre;
    // "aaa": two equal-rank pairs; the left one merges.
    EXPECT_EQ(tokenizer->encode("aaa", false), (Ids{kAa, 'a'})) << pre;
    EXPECT_EQ(tokenizer->encode("don't I'll", false), (Ids{kDon, kApostropheT, ' ', 'I', kApostropheLl})) << pre;
    EXPECT_EQ(tokenizer->encode("café", false), (Ids{'c', 'a', 'f', kEAcute})) << pre;
    EXPECT_EQ(tokenizer->encode("中文", false), (Ids{0xE4, 0xB8, 0xAD, 0xE6, 0x96, 0x87})) << pre;
    EXPECT_EQ(tokenizer->encode("😀!", false), (Ids{0xF0, 0x9F, 0x98, 0x80, '!'})) << pre;
    EXPECT_EQ(tokenizer->encode("\xFF\xFE", false), (Ids{0xFF, 0xFE})) << pre;
    EXPECT_EQ(tokenizer->encode("", false), Ids{}) << pre;
  }
}

TEST(BpeTokenizerTest, SpacesDigitsContractionsAndNewlinesFollowThePreTokenizer) {
  auto llama3 = make("llama-bpe");
  auto qwen2 = make("qwen2");
  auto gpt2 = make("gpt2");
  ASSERT_TRUE(llama3 && qwen2 && gpt2);
  // Leading, multiple and trailing spaces: "  the" = " " + " the"; "a   b" = "a" + "  " + " b".
  for (Tokenizer* t : {llama3.get(), qwen2.get(), gpt2.get()}) {
    EXPECT_EQ(t->encode("  the", false), (Ids{' ', kSpaceThe}));
    EXPECT_EQ(t->encode("a   b", false), (Ids{'a', kTwoSpaces, ' ', 'b'}));
    EXPECT_EQ(t->encode("the   ", false), (Ids{'t', kHe, kTwoSpaces, ' '}));
  }
  // Digits: llama3 groups "412"+"3"; qwen2 splits every digit; gpt2 keeps "4123" whole.
  EXPECT_EQ(llama3->encode("4123", false), (Ids{'4', k12, '3'}));
  EXPECT_EQ(qwen2->encode("4123", false), (Ids{'4', '1', '2', '3'}));
  EXPECT_EQ(gpt2->encode("4123", false), (Ids{'4', k123}));
  // Upper-case contraction: a piece of its own for llama3/qwen2 only.
  EXPECT_EQ(llama3->encode("I'LL", false), (Ids{'I', kApostropheLL}));
  EXPECT_EQ(qwen2->encode("I'LL", false), (Ids{'I', kApostropheLL}));
  EXPECT_EQ(gpt2->encode("I'LL", false), (Ids{'I', '\'', kLL}));
  // Newlines: llama3 keeps "\n\n" together (and after punctuation); gpt2 splits them.
  EXPECT_EQ(llama3->encode("a\n\nb", false), (Ids{'a', kTwoNewlines, 'b'}));
  EXPECT_EQ(gpt2->encode("a\n\nb", false), (Ids{'a', '\n', '\n', 'b'}));
  EXPECT_EQ(llama3->encode("Hi!!\n\nNext", false), (Ids{'H', 'i', '!', '!', kTwoNewlines, 'N', 'e', 'x', 't'}));
  EXPECT_EQ(gpt2->encode("Hi!!\n\nNext", false), (Ids{'H', 'i', '!', '!', '\n', '\n', 'N', 'e', 'x', 't'}));
  // "ignore merges": llama3 emits a whole-piece token that no merge sequence builds.
  EXPECT_EQ(llama3->encode("xyz", false), (Ids{kXyz}));
  EXPECT_EQ(qwen2->encode("xyz", false), (Ids{'x', 'y', 'z'}));
  EXPECT_EQ(gpt2->encode("xyz", false), (Ids{'x', 'y', 'z'}));
}

TEST(BpeTokenizerTest, PiecesAndSpecialTokens) {
  auto tokenizer = make("llama3");
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->token_to_piece(' '), " ");
  EXPECT_EQ(tokenizer->token_to_piece('\n'), "\n");
  EXPECT_EQ(tokenizer->token_to_piece(kSpaceThe), " the");
  EXPECT_EQ(tokenizer->token_to_piece(kEAcute), "é");
  EXPECT_EQ(tokenizer->token_to_piece(0xE4), "\xE4");
  EXPECT_EQ(tokenizer->token_to_piece(kEot), "");         // control
  EXPECT_EQ(tokenizer->token_to_piece(kTool), "<tool>");  // user-defined: raw text
  EXPECT_EQ(tokenizer->token_to_piece(9999), "");
  EXPECT_EQ(tokenizer->decode({kSpaceThe, kEot}), " the");  // BPE has no dummy prefix to strip

  EXPECT_EQ(tokenizer->encode("hi<|eot|><tool>", false, SpecialTokens::kParse), (Ids{'h', 'i', kEot, kTool}));
  // As text, the control token is characters; the user-defined one is still whole.
  const Ids as_text = tokenizer->encode("hi<|eot|><tool>", false);
  EXPECT_EQ(std::count(as_text.begin(), as_text.end(), kEot), 0);
  EXPECT_EQ(as_text.back(), kTool);
  EXPECT_EQ(tokenizer->decode(as_text), "hi<|eot|><tool>");
  // Leftmost wins; text around and between special tokens is encoded normally.
  EXPECT_EQ(tokenizer->encode(" the<|eot|> the", false, SpecialTokens::kParse), (Ids{kSpaceThe, kEot, kSpaceThe}));
  // BOS is added only when asked and present.
  TokenizerVocab vocab = hand_vocab("llama3");
  vocab.bos_id = kEot;
  auto with_bos = Tokenizer::create(vocab);
  ASSERT_TRUE(with_bos.ok()) << with_bos.status().message();
  EXPECT_EQ((*with_bos)->encode("the", true), (Ids{kEot, 't', kHe}));
  EXPECT_EQ(tokenizer->encode("the", true), (Ids{'t', kHe}));  // no bos_id
}

TEST(BpeTokenizerTest, MatchesPlainReferenceAndRoundTripsRandomBytes) {
  std::mt19937 rng(42);
  const std::vector<std::string> fragments = {"the", " the", "  ", "a", "aa", "'ll", "'LL", "'t", "do", "n't", "12",
                                              "3",   "\n",   "\n\n", "é", "中", "😀", "!", "?", "\r\n", "\t", " ",
                                              "<tool>"};
  for (const std::string name : {"llama3", "qwen2", "gpt2", "deepseek-v3", "gpt-4o", "tekken", "smollm", "deepseek-llm",
                                  "deepseek-coder", "falcon", "dbrx", "mpt", "stablelm2", "command-r", "bloom"}) {
    const TokenizerVocab vocab = hand_vocab(name);
    auto pre = BpePreTokenizer::create(name, nullptr);
    ASSERT_TRUE(pre.ok()) << pre.status().message();
    const bool nfc = pre->normalization() == TextNormalization::kNfc;
    auto tokenizer = make(name);
    ASSERT_NE(tokenizer, nullptr);
    for (int trial = 0; trial < 1500; ++trial) {
      std::string text;
      const int num_parts = static_cast<int>(rng() % 16);
      for (int i = 0; i < num_parts; ++i) {
        if (rng() % 3 == 0) {
          text.push_back(static_cast<char>(rng() % 256));  // any byte, often invalid UTF-8
        } else {
          text += fragments[rng() % fragments.size()];
        }
      }
      const Ids ids = tokenizer->encode(text, false);
      ASSERT_EQ(ids, reference_bpe_encode(vocab, name, text)) << name << " trial " << trial;
      // Qwen2, MPT and Command-R normalize to NFC, so their round trip gives the NFC form.
      const std::string want = nfc ? nfc_normalize(text) : text;
      ASSERT_EQ(tokenizer->decode(ids), want) << name << " trial " << trial;
      // Parsing special tokens splits out "<tool>" (user-defined, printed as its text).
      ASSERT_EQ(tokenizer->decode(tokenizer->encode(text, false, SpecialTokens::kParse)), want) << name << trial;
    }
  }
}

TEST(BpeTokenizerTest, LongRunsStayLinearAndExact) {
  auto tokenizer = make("llama3");
  ASSERT_NE(tokenizer, nullptr);
  // One 300000-letter word: 150000 "aa" merges, found through the heap.
  const std::string letters(300000, 'a');
  const Ids ids = tokenizer->encode(letters, false);
  ASSERT_EQ(ids.size(), 150000u);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), kAa), 150000);
  // Long whitespace and newline runs exercise the regex's backtracking.
  const std::string spaces = std::string(200000, ' ') + "x" + std::string(100000, '\n') + std::string(50000, ' ');
  EXPECT_EQ(tokenizer->decode(tokenizer->encode(spaces, false)), spaces);
}

TEST(BpeTokenizerTest, PreTypesAndWarnings) {
  const auto type_of = [](const Tokenizer& t) { return dynamic_cast<const BpeTokenizer&>(t).pre_tokenizer().type(); };
  for (const char* name : {"llama3", "llama-bpe", "llama-v3"}) {
    auto t = make(name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(type_of(*t), "llama3") << name;
    EXPECT_TRUE(t->warnings().empty()) << name;
  }
  auto qwen = make("qwen2");
  EXPECT_EQ(type_of(*qwen), "qwen2");
  auto gpt2 = make("default");
  EXPECT_EQ(type_of(*gpt2), "gpt2");
  EXPECT_TRUE(gpt2->warnings().empty());
  for (const char* name : {"deepseek-v3", "gpt-4o", "tekken", "smollm", "starcoder", "deepseek-r1-qwen", "deepseek-llm",
                           "deepseek-coder", "falcon", "dbrx", "smaug-bpe", "chatglm-bpe", "mpt", "stablelm2",
                           "command-r", "bloom"}) {
    auto t = make(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_TRUE(t->warnings().empty()) << name;
  }

  // An unknown type is an error naming it and the known ones, never GPT-2 in silence.
  auto unknown = Tokenizer::create(hand_vocab("mystery-pre"));
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("mystery-pre"), std::string::npos) << unknown.status().message();
  EXPECT_NE(unknown.status().message().find("llama-bpe"), std::string::npos) << unknown.status().message();
  // A file without the field gets GPT-2's, as the format defines, with a warning.
  auto missing = make("");
  ASSERT_NE(missing, nullptr);
  EXPECT_EQ(type_of(*missing), "gpt2");
  ASSERT_EQ(missing->warnings().size(), 1u);

  TokenizerVocab vocab = hand_vocab("llama3");
  vocab.merges.push_back("q z");  // "qz" is no token
  vocab.tokens.erase(vocab.tokens.begin() + 0x80);  // drops a byte symbol (and shifts later ids)
  vocab.token_types.erase(vocab.token_types.begin() + 0x80);
  vocab.eos_id = -1;
  auto damaged = Tokenizer::create(vocab);
  ASSERT_TRUE(damaged.ok()) << damaged.status().message();
  EXPECT_EQ((*damaged)->warnings().size(), 2u);
}

TEST(BpeTokenizerTest, MissingByteSymbolsBecomeUnknown) {
  TokenizerVocab vocab;
  vocab.model = "gpt2";
  vocab.pre = "gpt2";
  vocab.tokens = {"<unk>", "a", "b", "Ġ"};
  vocab.unk_id = 0;
  auto tokenizer = Tokenizer::create(vocab);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  EXPECT_EQ((*tokenizer)->token_type(0), TokenType::kUnknown);  // inferred from unk_id
  EXPECT_EQ((*tokenizer)->encode("ab c", false), (Ids{1, 2, 3, 0}));
  EXPECT_EQ((*tokenizer)->decode({1, 2, 3, 0}), "ab ");
}

}  // namespace
}  // namespace kvlm
