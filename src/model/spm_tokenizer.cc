#include "model/spm_tokenizer.h"

#include <algorithm>
#include <cstdint>

#include "core/check.h"
#include "model/unicode_utf8.h"

namespace kvlm {
namespace {

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // "▁" U+2581

std::string byte_piece_text(uint8_t byte) {
  return fmt::format("<0x{:02X}>", byte);
}

// The byte a "<0xAB>" piece stands for, or -1.
int parse_byte_piece(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return -1;
  int value = 0;
  for (const char c : piece.substr(3, 2)) {
    int digit = -1;
    if (c >= '0' && c <= '9') digit = c - '0';
    if (c >= 'a' && c <= 'f') digit = c - 'a' + 10;
    if (c >= 'A' && c <= 'F') digit = c - 'A' + 10;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

// One piece of the text being merged: a contiguous byte range in a doubly linked list.
struct Symbol {
  int32_t prev = -1;
  int32_t next = -1;
  uint32_t begin = 0;
  uint32_t length = 0;  // 0 once merged into its left neighbour
};

// A candidate merge of symbol `left` with its right neighbour `right`.
struct Bigram {
  float score = 0;
  int32_t left = 0;
  int32_t right = 0;
  uint32_t length = 0;  // left.length + right.length when queued; stale if that changed
};

// Max-heap order: higher score first, then the leftmost pair.
struct BigramLess {
  bool operator()(const Bigram& a, const Bigram& b) const {
    if (a.score != b.score) return a.score < b.score;
    return a.left > b.left;
  }
};

}  // namespace

Result<std::unique_ptr<Tokenizer>> SpmTokenizer::create(TokenizerVocab vocab) {
  if (vocab.scores.empty()) vocab.scores.assign(vocab.tokens.size(), 0.0f);
  std::unique_ptr<SpmTokenizer> tokenizer(new SpmTokenizer(std::move(vocab)));
  const int num_missing_bytes = tokenizer->num_bytes_without_token_;
  if (num_missing_bytes > 0) {
    tokenizer->add_warning(fmt::format(
        "{} of 256 bytes have no byte-fallback token; characters outside the vocabulary made of them "
        "encode as {}",
        num_missing_bytes, tokenizer->vocab_.unk_id >= 0 ? "the unknown token" : "nothing (dropped)"));
  }
  return std::unique_ptr<Tokenizer>(std::move(tokenizer));
}

SpmTokenizer::SpmTokenizer(TokenizerVocab vocab) : Tokenizer(std::move(vocab)) {
  const size_t n = vocab_.tokens.size();
  piece_ids_.reserve(n);
  pieces_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string& text = vocab_.tokens[i];
    const auto type = static_cast<TokenType>(vocab_.token_types[i]);
    switch (type) {
      case TokenType::kUndefined:
      case TokenType::kNormal:
      case TokenType::kUserDefined: {
        piece_ids_.insert_or_assign(std::string_view(text), static_cast<TokenId>(i));
        std::string& piece = pieces_[i];
        for (size_t pos = 0; pos < text.size();) {
          if (text.compare(pos, kSpaceMarker.size(), kSpaceMarker) == 0) {
            piece.push_back(' ');
            pos += kSpaceMarker.size();
          } else {
            piece.push_back(text[pos++]);
          }
        }
        break;
      }
      case TokenType::kByte: {
        const int byte = parse_byte_piece(text);
        if (byte >= 0) pieces_[i] = std::string(1, static_cast<char>(byte));
        break;
      }
      case TokenType::kUnknown:
      case TokenType::kControl:
      case TokenType::kUnused:
        break;  // printed as nothing
    }
  }
  // Character boundaries inside mergeable pieces, as (last byte before, first byte after).
  for (const auto& [piece, id] : piece_ids_) {
    size_t pos = std::max<size_t>(utf8_sequence_length(piece, 0), 1);
    while (pos < piece.size()) {
      joinable_pairs_.set(pair_index(piece[pos - 1], piece[pos]));
      pos += std::max<size_t>(utf8_sequence_length(piece, pos), 1);
    }
  }
  // llama.cpp falls back from "<0xAB>" to a token spelling the byte itself; we then use unk.
  for (int byte = 0; byte < 256; ++byte) {
    TokenId id = -1;
    if (auto found = find_token(byte_piece_text(static_cast<uint8_t>(byte)))) {
      id = *found;
    } else if (auto it = piece_ids_.find(std::string_view(std::string(1, static_cast<char>(byte))));
               it != piece_ids_.end()) {
      id = it->second;
    } else {
      id = vocab_.unk_id;
      ++num_bytes_without_token_;
    }
    byte_ids_[byte] = id;
  }
}

std::string SpmTokenizer::token_to_piece(TokenId id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return pieces_[id];
}

void SpmTokenizer::append_piece(std::string_view piece, std::vector<TokenId>* out) const {
  if (auto it = piece_ids_.find(piece); it != piece_ids_.end()) {
    out->push_back(it->second);
    return;
  }
  for (const char c : piece) {
    const TokenId id = byte_ids_[static_cast<uint8_t>(c)];
    if (id >= 0) out->push_back(id);
  }
}

void SpmTokenizer::merge_segment(std::string_view text, std::vector<TokenId>* out) const {
  std::vector<Symbol> symbols;
  for (size_t pos = 0; pos < text.size();) {
    const size_t length = std::max<size_t>(utf8_sequence_length(text, pos), 1);
    const auto idx = static_cast<int32_t>(symbols.size());
    symbols.push_back(Symbol{idx - 1, idx + 1, static_cast<uint32_t>(pos), static_cast<uint32_t>(length)});
    pos += length;
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  std::vector<Bigram> queue;  // binary heap ordered by BigramLess
  const auto try_add_bigram = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& a = symbols[left];
    const Symbol& b = symbols[right];
    const auto it = piece_ids_.find(text.substr(a.begin, a.length + b.length));
    if (it == piece_ids_.end()) return;
    queue.push_back(Bigram{vocab_.scores[it->second], left, right, a.length + b.length});
    std::push_heap(queue.begin(), queue.end(), BigramLess{});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) try_add_bigram(i - 1, i);

  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end(), BigramLess{});
    const Bigram bigram = queue.back();
    queue.pop_back();
    Symbol& left = symbols[bigram.left];
    Symbol& right = symbols[bigram.right];
    // Skip entries made stale by an earlier merge: a symbol only grows by absorbing its
    // right neighbour, so a changed total length (or an absorbed side) means stale.
    if (left.length == 0 || right.length == 0 || left.length + right.length != bigram.length) continue;
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = bigram.left;
    try_add_bigram(left.prev, bigram.left);
    try_add_bigram(bigram.left, left.next);
  }

  for (int32_t i = 0; i >= 0; i = symbols[i].next) {
    const Symbol& symbol = symbols[i];
    append_piece(text.substr(symbol.begin, symbol.length), out);
  }
}

void SpmTokenizer::encode_text(std::string_view text, bool after_special, std::vector<TokenId>* out) const {
  // The merge works on the escaped text: dummy prefix plus spaces as "▁".
  std::string escaped;
  escaped.reserve(text.size() + kSpaceMarker.size() * 4);
  if (after_special && vocab_.add_space_prefix) escaped.append(kSpaceMarker);
  for (const char c : text) {
    if (c == ' ') {
      escaped.append(kSpaceMarker);
    } else {
      escaped.push_back(c);
    }
  }
  KVLM_CHECK(escaped.size() < (size_t{1} << 31), "text of {} bytes is too long to tokenize", escaped.size());

  // Cut where no piece can span the character boundary: the merges on either side never
  // interact, so merging the segments one by one gives exactly the whole-text result,
  // with small heaps instead of one the size of the text.
  size_t segment_begin = 0;
  size_t pos = 0;
  while (pos < escaped.size()) {
    const size_t length = std::max<size_t>(utf8_sequence_length(escaped, pos), 1);
    const size_t next = pos + length;
    if (next < escaped.size() && !may_join(escaped[next - 1], escaped[next])) {
      merge_segment(std::string_view(escaped).substr(segment_begin, next - segment_begin), out);
      segment_begin = next;
    }
    pos = next;
  }
  merge_segment(std::string_view(escaped).substr(segment_begin), out);
}

}  // namespace kvlm
