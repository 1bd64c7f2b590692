// IncrementalDetokenizer and sanitize_utf8: streamed text equals the repaired whole decode, always valid UTF-8.
#include <gtest/gtest.h>

#include <random>
#include <span>

#include "gguf/gguf_file.h"
#include "model/incremental_detokenizer.h"
#include "model/tokenizer.h"
#include "model/tokenizer_gguf.h"
#include "model/unicode_utf8.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

using Ids = std::vector<TokenId>;
constexpr std::string_view kFffd = "\xEF\xBF\xBD";

// The Unicode "well-formed UTF-8 byte sequences" table (ch. 3, table 3-7), restated
// here so that the oracle below shares nothing with the code under test.
struct Row {
  int length;
  uint8_t lo[4];
  uint8_t hi[4];
};
constexpr Row kRows[] = {
    {1, {0x00}, {0x7F}},
    {2, {0xC2, 0x80}, {0xDF, 0xBF}},
    {3, {0xE0, 0xA0, 0x80}, {0xE0, 0xBF, 0xBF}},
    {3, {0xE1, 0x80, 0x80}, {0xEC, 0xBF, 0xBF}},
    {3, {0xED, 0x80, 0x80}, {0xED, 0x9F, 0xBF}},
    {3, {0xEE, 0x80, 0x80}, {0xEF, 0xBF, 0xBF}},
    {4, {0xF0, 0x90, 0x80, 0x80}, {0xF0, 0xBF, 0xBF, 0xBF}},
    {4, {0xF1, 0x80, 0x80, 0x80}, {0xF3, 0xBF, 0xBF, 0xBF}},
    {4, {0xF4, 0x80, 0x80, 0x80}, {0xF4, 0x8F, 0xBF, 0xBF}},
};

// How many bytes from text[pos] fit the row, stopping at the first that does not.
int num_matching(const Row& row, std::string_view text, size_t pos) {
  int n = 0;
  while (n < row.length && pos + n < text.size()) {
    const auto byte = static_cast<uint8_t>(text[pos + n]);
    if (byte < row.lo[n] || byte > row.hi[n]) break;
    ++n;
  }
  return n;
}

// The replacement rule by its definition: a well-formed sequence is kept; otherwise the
// longest prefix of one (at least one byte) is a maximal subpart, replaced by one U+FFFD.
std::string reference_sanitize(std::string_view text) {
  std::string out;
  size_t pos = 0;
  while (pos < text.size()) {
    int longest = 0;
    bool well_formed = false;
    for (const Row& row : kRows) {
      const int n = num_matching(row, text, pos);
      if (n == row.length) {
        out.append(text.substr(pos, n));
        pos += n;
        well_formed = true;
        break;
      }
      longest = std::max(longest, n);
    }
    if (well_formed) continue;
    out.append(kFffd);
    pos += std::max(longest, 1);
  }
  return out;
}

bool valid_utf8(std::string_view text) { return reference_sanitize(text) == text; }

std::string hex(std::string_view bytes) {
  std::string out;
  for (const char c : bytes) out += fmt::format("{:02X} ", static_cast<uint8_t>(c));
  return out;
}

TEST(DetokSanitizeTest, MaximalSubpartsBecomeOneReplacementEach) {
  const std::string r(kFffd);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", ""},
      {"abc", "abc"},
      {"\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80", "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80"},  // é € 😀
      {"\xED\x9F\xBF\xEE\x80\x80\xF4\x8F\xBF\xBF", "\xED\x9F\xBF\xEE\x80\x80\xF4\x8F\xBF\xBF"},  // edges
      {"\x80", r},                                // stray continuation
      {"\x80\xBF", r + r},                        // each continuation on its own
      {"\xC0\xAF", r + r},                        // C0 never starts a sequence: overlong '/'
      {"\xC1\xBF", r + r},
      {"\xE0\x80\xAF", r + r + r},                // overlong: E0 wants A0..BF next
      {"\xF0\x8F\xBF\xBF", r + r + r + r},        // overlong: F0 wants 90..BF next
      {"\xED\xA0\x80", r + r + r},                // surrogate D800
      {"\xF4\x90\x80\x80", r + r + r + r},        // above U+10FFFF
      {"\xF5\x80", r + r},                        // F5..FF never start one
      {"\xFF", r},
      {"\xC2", r},                                // truncated at the end
      {"\xE2\x82", r},
      {"\xF0\x9F\x98", r},
      {"\xE2\x82" "A", r + "A"},                  // interrupted: the ASCII byte survives
      {"\xF0\x9F\x98" "A", r + "A"},
      {"\xE2\x82\xE2\x82\xAC", r + "\xE2\x82\xAC"},  // a new lead interrupts, then completes
      {"\xC2\xC2\xA9", r + "\xC2\xA9"},
      // The example of Unicode ch. 3 ("U+FFFD Substitution of Maximal Subparts").
      {"\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64", "a" + r + r + r + "b" + r + "c" + r + r + "d"},
  };
  for (const auto& [input, expected] : cases) {
    EXPECT_EQ(hex(sanitize_utf8(input)), hex(expected)) << "input " << hex(input);
    EXPECT_EQ(hex(reference_sanitize(input)), hex(expected)) << "oracle, input " << hex(input);
  }
}

TEST(DetokSanitizeTest, RandomBytesMatchTheOracleInAnyChunking) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 3000; ++trial) {
    std::string bytes(rng() % 24, '\0');
    // Mostly bytes >= 0x80, so that leads, continuations and the edge ranges all occur.
    for (char& c : bytes) c = static_cast<char>(rng() % 4 == 0 ? rng() % 0x80 : 0x80 + rng() % 0x80);
    const std::string expected = reference_sanitize(bytes);
    ASSERT_EQ(hex(sanitize_utf8(bytes)), hex(expected)) << hex(bytes);
    ASSERT_TRUE(valid_utf8(expected));

    Utf8StreamRepair repair;
    std::string streamed;
    for (size_t pos = 0; pos < bytes.size();) {
      const size_t n = std::min<size_t>(rng() % 4, bytes.size() - pos);
      repair.append(std::string_view(bytes).substr(pos, n), &streamed);
      ASSERT_TRUE(valid_utf8(streamed)) << hex(bytes);
      pos += n;
    }
    repair.finish(&streamed);
    ASSERT_EQ(hex(streamed), hex(expected)) << hex(bytes);
  }
}

// What a run streams: the prompt's text, each push, the final flush.
std::vector<std::string> stream(const Tokenizer& tokenizer, const Ids& prompt, const Ids& generated) {
  IncrementalDetokenizer detok(tokenizer);
  std::vector<std::string> pieces = {detok.set_prompt(prompt)};
  for (const TokenId id : generated) pieces.push_back(detok.push(id));
  pieces.push_back(detok.finish());
  std::string all;
  for (const std::string& piece : pieces) all += piece;
  EXPECT_EQ(all, detok.text());
  return pieces;
}

std::string joined(const std::vector<std::string>& pieces) {
  std::string all;
  for (const std::string& piece : pieces) all += piece;
  return all;
}

std::unique_ptr<Tokenizer> create(TokenizerVocab vocab) {
  auto tokenizer = Tokenizer::create(std::move(vocab));
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  return tokenizer.ok() ? std::move(tokenizer).value() : nullptr;
}

// <unk> <s> </s>, the 256 byte tokens (id 3 + byte), then a few pieces.
constexpr TokenId kUnk = 0, kBos = 1, kEos = 2, kHello = 259, kA = 260, kB = 261, kEuro = 262;
TokenizerVocab spm_vocab(bool add_space_prefix) {
  TokenizerVocab vocab;
  vocab.model = "llama";
  vocab.tokens = {"<unk>", "<s>", "</s>"};
  for (int b = 0; b < 256; ++b) vocab.tokens.push_back(fmt::format("<0x{:02X}>", b));
  for (const char* piece : {"\xE2\x96\x81hello", "\xE2\x96\x81" "a", "b", "\xE2\x82\xAC", "\xE2\x96\x81", "\xC3\xA9"}) {
    vocab.tokens.push_back(piece);
  }
  vocab.unk_id = kUnk;
  vocab.bos_id = kBos;
  vocab.eos_id = kEos;
  vocab.add_space_prefix = add_space_prefix;
  return vocab;
}
TokenId spm_byte(uint8_t b) { return 3 + b; }

// GPT-2 byte-level symbols: printable Latin-1 bytes stand for themselves, the others
// get U+0100 onwards in byte order.
std::string byte_symbol(uint8_t byte) {
  char32_t cp = 0x100;
  for (int b = 0; b < byte; ++b) {
    if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))) ++cp;
  }
  const bool printable = (byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE;
  std::string out;
  append_utf8(printable ? static_cast<char32_t>(byte) : cp, &out);
  return out;
}

// Ids 0..255 are the bytes; then merged pieces ("€" in two steps), then a control token.
TokenizerVocab bpe_vocab() {
  TokenizerVocab vocab;
  vocab.model = "gpt2";
  vocab.add_bos = false;
  for (int b = 0; b < 256; ++b) vocab.tokens.push_back(byte_symbol(static_cast<uint8_t>(b)));
  const auto add_merge = [&](std::string left, std::string right) {
    vocab.merges.push_back(left + " " + right);
    vocab.tokens.push_back(left + right);
  };
  add_merge(byte_symbol(' '), "h");
  add_merge(byte_symbol(0xE2), byte_symbol(0x82));
  add_merge(byte_symbol(0xE2) + byte_symbol(0x82), byte_symbol(0xAC));
  add_merge(byte_symbol(0xC3), byte_symbol(0xA9));
  vocab.tokens.push_back("<|eot|>");
  vocab.token_types.assign(vocab.tokens.size(), static_cast<int32_t>(TokenType::kNormal));
  vocab.token_types.back() = static_cast<int32_t>(TokenType::kControl);
  vocab.eos_id = static_cast<TokenId>(vocab.tokens.size() - 1);
  return vocab;
}

TEST(DetokSpmTest, LeadingSpaceFollowsDecode) {
  auto tok = create(spm_vocab(true));
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(stream(*tok, {kBos}, {kHello, kA, kHello}), (std::vector<std::string>{"", "hello", " a", " hello", ""}));
  EXPECT_EQ(stream(*tok, {kBos, kHello}, {kA}), (std::vector<std::string>{"hello", " a", ""}));
  EXPECT_EQ(stream(*tok, {}, {kHello}), (std::vector<std::string>{"", "hello", ""}));
  // Control tokens print nothing and do not count as the first printed token; unknown does.
  EXPECT_EQ(joined(stream(*tok, {kBos, kEos}, {kHello, kA})), "hello a");
  EXPECT_EQ(joined(stream(*tok, {kBos, kUnk}, {kHello})), " hello");
  for (const Ids& ids : {Ids{kBos, kEos, kHello, kA}, Ids{kBos, kUnk, kHello}, Ids{kA, kHello}}) {
    EXPECT_EQ(joined(stream(*tok, {}, ids)), tok->decode(ids));
  }
  auto no_prefix = create(spm_vocab(false));
  ASSERT_NE(no_prefix, nullptr);
  EXPECT_EQ(joined(stream(*no_prefix, {kBos}, {kHello, kA})), " hello a");
}

TEST(DetokSpmTest, SplitCharactersWaitForTheirLastByte) {
  auto tok = create(spm_vocab(true));
  ASSERT_NE(tok, nullptr);
  const Ids euro = {spm_byte(0xE2), spm_byte(0x82), spm_byte(0xAC)};
  EXPECT_EQ(stream(*tok, {kBos}, euro), (std::vector<std::string>{"", "", "", "\xE2\x82\xAC", ""}));
  const Ids smiley = {spm_byte(0xF0), spm_byte(0x9F), spm_byte(0x98), spm_byte(0x80)};
  EXPECT_EQ(stream(*tok, {kBos, kB}, smiley), (std::vector<std::string>{"b", "", "", "", "\xF0\x9F\x98\x80", ""}));
  // A prompt ending inside a character: the generated token completes it.
  EXPECT_EQ(stream(*tok, {kBos, kB, spm_byte(0xE2), spm_byte(0x82)}, {spm_byte(0xAC), kEuro}),
            (std::vector<std::string>{"b", "\xE2\x82\xAC", "\xE2\x82\xAC", ""}));
  // Interrupted: the held bytes become one U+FFFD, emitted with the interrupting piece.
  const std::string r(kFffd);
  EXPECT_EQ(stream(*tok, {kBos}, {spm_byte(0xE2), spm_byte(0x82), kA}),
            (std::vector<std::string>{"", "", "", r + " a", ""}));
  EXPECT_EQ(stream(*tok, {kBos}, {spm_byte(0xE2), spm_byte(0x82), kEuro}),
            (std::vector<std::string>{"", "", "", r + "\xE2\x82\xAC", ""}));
  EXPECT_EQ(stream(*tok, {kBos}, {spm_byte(0xC0), spm_byte(0x80)}), (std::vector<std::string>{"", r, r, ""}));
}

TEST(DetokSpmTest, FinishFlushesAnIncompleteCharacter) {
  auto tok = create(spm_vocab(true));
  ASSERT_NE(tok, nullptr);
  IncrementalDetokenizer detok(*tok);
  EXPECT_EQ(detok.set_prompt(Ids{kBos, kHello, spm_byte(0xF0)}), "hello");
  EXPECT_EQ(detok.push(spm_byte(0x9F)), "");
  EXPECT_EQ(detok.finish(), kFffd);
  EXPECT_EQ(detok.text(), "hello" + std::string(kFffd));
  EXPECT_EQ(detok.finish(), "");  // nothing held any more
  EXPECT_DEATH(detok.push(kA), "after finish");
  // set_prompt starts a fresh sequence: the leading-space rule applies again.
  EXPECT_EQ(detok.set_prompt(Ids{kBos}), "");
  EXPECT_EQ(detok.push(kA), "a");
  EXPECT_EQ(detok.text(), "a");
}

// Random prompt + continuation: mostly byte tokens that spell (or truncate) characters,
// with whole pieces, control tokens and ids outside the vocabulary mixed in.
Ids random_tokens(std::mt19937& rng, const Tokenizer& tok, const std::vector<TokenId>& byte_ids, size_t count) {
  Ids ids;
  while (ids.size() < count) {
    const uint32_t kind = rng() % 10;
    if (kind < 3) {
      ids.push_back(static_cast<TokenId>(rng() % tok.vocab_size()));
    } else if (kind < 8) {
      static constexpr char32_t kStarts[] = {0x20, 0x80, 0x800, 0xE000, 0x10000};
      static constexpr char32_t kSizes[] = {0x60, 0x780, 0xD000, 0x2000, 0x100000};
      const int range = static_cast<int>(rng() % 5);
      std::string bytes;
      append_utf8(kStarts[range] + rng() % kSizes[range], &bytes);
      if (kind == 7) bytes.resize(1 + rng() % bytes.size());  // maybe truncated
      for (const char c : bytes) ids.push_back(byte_ids[static_cast<uint8_t>(c)]);
    } else if (kind == 8) {
      ids.push_back(rng() % 2 ? tok.eos_id() : tok.bos_id());
    } else {
      ids.push_back(rng() % 2 ? -1 : tok.vocab_size());
    }
  }
  ids.resize(count);
  return ids;
}

void expect_streams_match_decode(const Tokenizer& tok, const std::vector<TokenId>& byte_ids, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 400; ++trial) {
    Ids prompt = random_tokens(rng, tok, byte_ids, rng() % 12);
    if (rng() % 2 && tok.bos_id() >= 0) prompt.insert(prompt.begin(), tok.bos_id());
    const Ids generated = random_tokens(rng, tok, byte_ids, rng() % 30);
    Ids all = prompt;
    all.insert(all.end(), generated.begin(), generated.end());
    const std::vector<std::string> pieces = stream(tok, prompt, generated);
    for (const std::string& piece : pieces) ASSERT_TRUE(valid_utf8(piece)) << hex(piece);
    const std::string decoded = tok.decode(all);
    ASSERT_EQ(hex(joined(pieces)), hex(sanitize_utf8(decoded))) << "trial " << trial;
    ASSERT_EQ(hex(joined(pieces)), hex(reference_sanitize(decoded))) << "trial " << trial;
  }
}

std::vector<TokenId> spm_byte_ids() {
  std::vector<TokenId> ids;
  for (int b = 0; b < 256; ++b) ids.push_back(spm_byte(static_cast<uint8_t>(b)));
  return ids;
}

TEST(DetokSpmTest, RandomStreamsEqualTheRepairedDecode) {
  for (const bool prefix : {true, false}) {
    auto tok = create(spm_vocab(prefix));
    ASSERT_NE(tok, nullptr);
    expect_streams_match_decode(*tok, spm_byte_ids(), prefix ? 11 : 12);
  }
}

TEST(DetokBpeTest, RandomStreamsEqualTheRepairedDecode) {
  auto tok = create(bpe_vocab());
  ASSERT_NE(tok, nullptr);
  std::vector<TokenId> byte_ids;
  for (int b = 0; b < 256; ++b) byte_ids.push_back(b);
  expect_streams_match_decode(*tok, byte_ids, 21);
  // Merged pieces that end inside a character: "€" as E2 82 + AC, "é" whole, " h" keeps its space.
  const TokenId e2_82 = 257, euro = 258, e_acute = 259;
  EXPECT_EQ(stream(*tok, {}, {e2_82, 0xAC, euro, e_acute, 256}),
            (std::vector<std::string>{"", "", "\xE2\x82\xAC", "\xE2\x82\xAC", "\xC3\xA9", " h", ""}));
}

TEST(DetokStories260KTest, RealVocabularyStreamsEqualTheRepairedDecode) {
  KVLM_REQUIRE_SHARED(gguf_path, "stories260K.gguf");
  auto file = GgufFile::open(gguf_path.string());
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto vocab = load_tokenizer_vocab(**file);
  ASSERT_TRUE(vocab.ok()) << vocab.status().message();
  auto tok = create(std::move(vocab).value());
  ASSERT_NE(tok, nullptr);
  std::vector<TokenId> byte_ids;
  for (int b = 0; b < 256; ++b) {
    const std::optional<TokenId> id = tok->find_token(fmt::format("<0x{:02X}>", b));
    ASSERT_TRUE(id.has_value()) << "byte " << b;
    byte_ids.push_back(*id);
  }
  expect_streams_match_decode(*tok, byte_ids, 31);

  // Text the vocabulary lacks falls back to byte tokens; streaming restores it exactly.
  const std::string text = "Once upon a time \xE2\x82\xAC 5, caf\xC3\xA9 \xF0\x9F\x98\x80 the end.";
  const Ids ids = tok->encode(text, /*add_bos=*/true);
  const size_t split = ids.size() / 2;
  const std::vector<std::string> pieces =
      stream(*tok, Ids(ids.begin(), ids.begin() + split), Ids(ids.begin() + split, ids.end()));
  EXPECT_EQ(joined(pieces), text);
  for (const std::string& piece : pieces) EXPECT_TRUE(valid_utf8(piece)) << hex(piece);
}

}  // namespace
}  // namespace kvlm
