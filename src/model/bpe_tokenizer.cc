#include "model/bpe_tokenizer.h"

#include <algorithm>
#include <optional>

#include "model/unicode_normalize.h"
#include "model/unicode_utf8.h"

namespace kvlm {
namespace {

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68
// bytes (controls, space, DEL, NBSP, soft hyphen...) for U+0100.. in byte order, so every
// byte becomes a visible character.
std::array<char32_t, 256> byte_to_code_point() {
  std::array<char32_t, 256> table{};
  char32_t next_extra = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    table[b] = printable ? static_cast<char32_t>(b) : next_extra++;
  }
  return table;
}

// Strings of byte_to_code_point(), and the reverse map over code points 0..323.
struct ByteAlphabet {
  std::array<std::string, 256> symbol;
  std::array<int16_t, 324> byte_of{};  // -1: not a byte symbol

  ByteAlphabet() {
    byte_of.fill(-1);
    const std::array<char32_t, 256> code_points = byte_to_code_point();
    for (int b = 0; b < 256; ++b) {
      append_utf8(code_points[b], &symbol[b]);
      byte_of[code_points[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet alphabet;
  return alphabet;
}

// Maps a token's byte-level text back to bytes; characters outside the alphabet (never
// in real vocabularies) are kept as they are.
std::string decode_byte_level(std::string_view text) {
  const ByteAlphabet& alphabet = byte_alphabet();
  std::string bytes;
  for (size_t pos = 0; pos < text.size();) {
    const size_t length = utf8_sequence_length(text, pos);
    if (length == 0) {
      bytes.push_back(text[pos++]);
      continue;
    }
    const char32_t cp = utf8_decode(text, pos, length);
    if (cp < alphabet.byte_of.size() && alphabet.byte_of[cp] >= 0) {
      bytes.push_back(static_cast<char>(alphabet.byte_of[cp]));
    } else {
      bytes.append(text.substr(pos, length));
    }
    pos += length;
  }
  return bytes;
}

// One symbol of a word being merged, in a doubly linked list.
struct Symbol {
  int32_t prev = -1;
  int32_t next = -1;
  TokenId id = -1;  // -1: a byte without a token (never merges)
  bool alive = true;
};

struct Bigram {
  int32_t rank = 0;
  int32_t left = 0;
  int32_t right = 0;
  TokenId left_id = -1;   // ids when queued: a changed id means the entry is stale
  TokenId right_id = -1;
  TokenId merged = -1;
};

// Min-heap order through std::push_heap's max-heap: lowest rank first, then leftmost.
struct BigramGreater {
  bool operator()(const Bigram& a, const Bigram& b) const {
    if (a.rank != b.rank) return a.rank > b.rank;
    return a.left > b.left;
  }
};

}  // namespace

Result<std::unique_ptr<Tokenizer>> BpeTokenizer::create(TokenizerVocab vocab) {
  std::string pre_warning;
  KVLM_ASSIGN_OR_RETURN(BpePreTokenizer pre, BpePreTokenizer::create(vocab.pre, &pre_warning));
  std::unique_ptr<BpeTokenizer> tokenizer(new BpeTokenizer(std::move(vocab), std::move(pre)));
  if (!pre_warning.empty()) tokenizer->add_warning(std::move(pre_warning));
  KVLM_RETURN_IF_ERROR(tokenizer->parse_merges());
  int num_missing_bytes = 0;
  for (const TokenId id : tokenizer->byte_ids_) num_missing_bytes += id < 0 ? 1 : 0;
  if (num_missing_bytes > 0) {
    tokenizer->add_warning(fmt::format("{} of 256 byte symbols are not tokens; those bytes encode as {}",
                                       num_missing_bytes,
                                       tokenizer->vocab_.unk_id >= 0 ? "the unknown token" : "nothing (dropped)"));
  }
  return std::unique_ptr<Tokenizer>(std::move(tokenizer));
}

BpeTokenizer::BpeTokenizer(TokenizerVocab vocab, BpePreTokenizer pre_tokenizer)
    : Tokenizer(std::move(vocab)), pre_tokenizer_(std::move(pre_tokenizer)) {
  const ByteAlphabet& alphabet = byte_alphabet();
  for (int b = 0; b < 256; ++b) byte_ids_[b] = find_token(alphabet.symbol[b]).value_or(-1);
  pieces_.resize(vocab_.tokens.size());
  for (size_t i = 0; i < vocab_.tokens.size(); ++i) {
    switch (static_cast<TokenType>(vocab_.token_types[i])) {
      case TokenType::kUndefined:
      case TokenType::kNormal:
      case TokenType::kByte:
        pieces_[i] = decode_byte_level(vocab_.tokens[i]);
        break;
      case TokenType::kUserDefined:
        pieces_[i] = vocab_.tokens[i];  // added tokens are stored as plain text
        break;
      case TokenType::kUnknown:
      case TokenType::kControl:
      case TokenType::kUnused:
        break;  // printed as nothing
    }
  }
}

Status BpeTokenizer::parse_merges() {
  merges_.reserve(vocab_.merges.size());
  int num_skipped = 0;
  std::string first_skipped;
  for (size_t rank = 0; rank < vocab_.merges.size(); ++rank) {
    const std::string_view merge = vocab_.merges[rank];
    // Searching from index 1 lets a left side begin with a space, as llama.cpp allows.
    const size_t space = merge.find(' ', 1);
    if (space == std::string_view::npos) {
      return Status::errorf("merge {} ('{}') is not two tokens separated by a space", rank, merge);
    }
    const std::string_view left = merge.substr(0, space);
    const std::string_view right = merge.substr(space + 1);
    const std::optional<TokenId> left_id = find_token(left);
    const std::optional<TokenId> right_id = find_token(right);
    const std::optional<TokenId> merged_id = find_token(std::string(left) + std::string(right));
    if (!left_id || !right_id || !merged_id) {
      if (num_skipped++ == 0) first_skipped = std::string(merge);
      continue;
    }
    // The first (lowest-rank) occurrence of a pair wins, as in llama.cpp.
    merges_.emplace(pair_key(*left_id, *right_id), Merge{static_cast<int32_t>(rank), *merged_id});
  }
  if (num_skipped > 0) {
    add_warning(fmt::format("{} merges name pieces that are not tokens and are ignored (first: '{}')", num_skipped,
                            first_skipped));
  }
  return Status::ok_status();
}

std::string BpeTokenizer::token_to_piece(TokenId id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return pieces_[id];
}

void BpeTokenizer::encode_text(std::string_view text, bool /*after_special*/, std::vector<TokenId>* out) const {
  const ByteAlphabet& alphabet = byte_alphabet();
  // Normalized text must outlive `words`, which view into it.
  std::string normalized;
  if (pre_tokenizer_.normalization() == TextNormalization::kNfc) {
    normalized = nfc_normalize(text);
    text = normalized;
  }
  std::vector<std::string_view> words;
  pre_tokenizer_.split(text, &words);

  std::vector<Symbol> symbols;
  std::vector<Bigram> queue;  // heap ordered by BigramGreater
  std::string mapped;
  const auto try_add_bigram = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const TokenId left_id = symbols[left].id;
    const TokenId right_id = symbols[right].id;
    if (left_id < 0 || right_id < 0) return;
    const auto it = merges_.find(pair_key(left_id, right_id));
    if (it == merges_.end()) return;
    queue.push_back(Bigram{it->second.rank, left, right, left_id, right_id, it->second.merged});
    std::push_heap(queue.begin(), queue.end(), BigramGreater{});
  };

  for (const std::string_view word : words) {
    if (pre_tokenizer_.ignore_merges()) {
      mapped.clear();
      for (const char c : word) mapped += alphabet.symbol[static_cast<uint8_t>(c)];
      if (const std::optional<TokenId> id = find_token(mapped)) {
        out->push_back(*id);
        continue;
      }
    }
    if (word.size() == 1) {  // common for punctuation and digits: nothing to merge
      const TokenId id = byte_ids_[static_cast<uint8_t>(word[0])];
      if (id >= 0 || vocab_.unk_id >= 0) out->push_back(id >= 0 ? id : vocab_.unk_id);
      continue;
    }

    symbols.clear();
    queue.clear();
    const auto num_symbols = static_cast<int32_t>(word.size());
    for (int32_t i = 0; i < num_symbols; ++i) {
      symbols.push_back(Symbol{i - 1, i + 1 < num_symbols ? i + 1 : -1, byte_ids_[static_cast<uint8_t>(word[i])]});
    }
    for (int32_t i = 1; i < num_symbols; ++i) try_add_bigram(i - 1, i);

    while (!queue.empty()) {
      std::pop_heap(queue.begin(), queue.end(), BigramGreater{});
      const Bigram bigram = queue.back();
      queue.pop_back();
      Symbol& left = symbols[bigram.left];
      Symbol& right = symbols[bigram.right];
      if (!left.alive || !right.alive || left.next != bigram.right || left.id != bigram.left_id ||
          right.id != bigram.right_id) {
        continue;  // stale: one side changed since this pair was queued
      }
      left.id = bigram.merged;
      left.next = right.next;
      right.alive = false;
      if (right.next >= 0) symbols[right.next].prev = bigram.left;
      try_add_bigram(left.prev, bigram.left);
      try_add_bigram(bigram.left, left.next);
    }

    for (int32_t i = 0; i >= 0; i = symbols[i].next) {
      const TokenId id = symbols[i].id;
      if (id >= 0) {
        out->push_back(id);
      } else if (vocab_.unk_id >= 0) {
        out->push_back(vocab_.unk_id);
      }
    }
  }
}

}  // namespace kvlm
