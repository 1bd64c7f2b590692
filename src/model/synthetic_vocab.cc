#include "model/synthetic_vocab.h"

#include <array>
#include <cctype>
#include <string_view>
#include <unordered_set>

#include "gguf/gguf_writer.h"
#include "model/llama_gguf_names.h"

namespace kvlm {
namespace {

namespace names = llama_names;

constexpr std::string_view kSpace = "\xE2\x96\x81";  // "▁" U+2581, SentencePiece's space
// Bounds the n-gram enumeration; far above any real vocabulary (the largest are ~256k).
constexpr int kSynthMaxVocabSize = 1 << 22;

// Frequent English words; they become "▁word" pieces so synthetic text tokenizes in few pieces.
constexpr std::array<std::string_view, 96> kCommonWords = {
    "the",   "and",  "to",    "of",    "a",     "in",    "is",    "it",   "you",  "that",  "he",    "was",
    "for",   "on",   "are",   "with",  "as",    "I",     "his",   "they", "be",   "at",    "one",   "have",
    "this",  "from", "or",    "had",   "by",    "hot",   "word",  "but",  "what", "some",  "we",    "can",
    "out",   "other", "were", "all",   "there", "when",  "up",    "use",  "your", "how",   "said",  "an",
    "each",  "she",  "which", "do",    "their", "time",  "if",    "will", "way",  "about", "many",  "then",
    "them",  "would", "like", "so",    "these", "her",   "long",  "make", "thing", "see",  "him",   "two",
    "has",   "look", "more",  "day",   "could", "go",    "come",  "did",  "my",   "sound", "no",    "most",
    "number", "who", "over",  "know",  "water", "than",  "call",  "first", "people", "may", "down", "Once"};

// Appends distinct pieces until the vocabulary is full.
class PieceSink {
 public:
  PieceSink(SpmVocab& vocab, int vocab_size) : vocab_(vocab), vocab_size_(vocab_size) {
    seen_.reserve(static_cast<size_t>(vocab_size));
  }

  bool full() const { return vocab_.size() >= vocab_size_; }

  void add(std::string piece) {
    if (full() || !seen_.insert(piece).second) return;
    // Decreasing scores rank earlier (shorter, more common) pieces first, as SentencePiece does.
    vocab_.scores.push_back(-static_cast<float>(num_pieces_++));
    vocab_.token_types.push_back(static_cast<int32_t>(TokenType::kNormal));
    vocab_.tokens.push_back(std::move(piece));
  }

 private:
  SpmVocab& vocab_;
  int vocab_size_;
  int num_pieces_ = 0;
  std::unordered_set<std::string> seen_;
};

// All lowercase strings of `length` letters in lexicographic order, each with `prefix`.
void add_ngrams(PieceSink& sink, std::string_view prefix, int length) {
  std::string piece(prefix);
  piece.append(static_cast<size_t>(length), 'a');
  const size_t first = prefix.size();
  while (!sink.full()) {
    sink.add(piece);
    // Odometer increment over the last `length` characters.
    size_t i = piece.size();
    while (i > first && piece[i - 1] == 'z') piece[--i] = 'a';
    if (i == first) return;
    ++piece[i - 1];
  }
}

}  // namespace

bool is_spm_byte_piece(const std::string& piece) {
  return piece.size() == 6 && piece.compare(0, 3, "<0x") == 0 && std::isxdigit(static_cast<unsigned char>(piece[3])) &&
         std::isxdigit(static_cast<unsigned char>(piece[4])) && piece[5] == '>';
}

void add_spm_vocab_metadata(GgufWriter& writer, const SpmVocab& vocab) {
  writer.set_string(names::kTokModel, "llama");
  writer.set(names::kTokTokens, GgufValue::string_array(vocab.tokens));
  writer.set(names::kTokScores, GgufValue::f32_array(vocab.scores));
  writer.set(names::kTokTypes, GgufValue::i32_array(vocab.token_types));
  writer.set_u32(names::kTokBos, kSpmBosId);
  writer.set_u32(names::kTokEos, kSpmEosId);
  writer.set_u32(names::kTokUnk, kSpmUnkId);
  writer.set_bool(names::kTokAddBos, true);
  writer.set_bool(names::kTokAddSpacePrefix, true);
}

Result<SpmVocab> make_synthetic_vocab(int vocab_size) {
  if (vocab_size < kSynthMinVocabSize || vocab_size > kSynthMaxVocabSize) {
    return Status::errorf(
        "synthetic vocabulary size {} is out of range [{}, {}]: it needs <unk>, <s>, </s>, the 256 byte tokens "
        "and at least the space piece",
        vocab_size, kSynthMinVocabSize, kSynthMaxVocabSize);
  }
  SpmVocab vocab;
  vocab.tokens.reserve(static_cast<size_t>(vocab_size));
  vocab.scores.reserve(static_cast<size_t>(vocab_size));
  vocab.token_types.reserve(static_cast<size_t>(vocab_size));
  auto add_special = [&](std::string piece, TokenType type) {
    vocab.tokens.push_back(std::move(piece));
    vocab.scores.push_back(0.0f);
    vocab.token_types.push_back(static_cast<int32_t>(type));
  };
  add_special("<unk>", TokenType::kUnknown);
  add_special("<s>", TokenType::kControl);
  add_special("</s>", TokenType::kControl);
  for (int b = 0; b < kSpmNumByteTokens; ++b) add_special(fmt::format("<0x{:02X}>", b), TokenType::kByte);

  PieceSink sink(vocab, vocab_size);
  sink.add(std::string(kSpace));
  for (char c = 'a'; c <= 'z'; ++c) sink.add(std::string(1, c));
  for (char c = 'A'; c <= 'Z'; ++c) sink.add(std::string(1, c));
  for (char c = '0'; c <= '9'; ++c) sink.add(std::string(1, c));
  for (char c = '!'; c <= '~'; ++c) {
    if (!std::isalnum(static_cast<unsigned char>(c))) sink.add(std::string(1, c));
  }
  for (char c = 'a'; c <= 'z'; ++c) sink.add(fmt::format("{}{}", kSpace, c));
  for (char c = 'A'; c <= 'Z'; ++c) sink.add(fmt::format("{}{}", kSpace, c));
  for (std::string_view w : kCommonWords) sink.add(fmt::format("{}{}", kSpace, w));
  // 26^L grows fast: lengths up to 5 already give ~24M candidates, beyond kSynthMaxVocabSize.
  for (int length = 2; !sink.full(); ++length) {
    add_ngrams(sink, "", length);
    add_ngrams(sink, kSpace, length);
  }
  return vocab;
}

}  // namespace kvlm
