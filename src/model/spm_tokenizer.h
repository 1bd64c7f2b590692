// SpmTokenizer: SentencePiece-style tokenizer (GGUF model "llama"): score-driven merges with byte fallback.
#pragma once

#include <array>
#include <bitset>
#include <cstdint>
#include <memory>

#include "model/tokenizer.h"

namespace kvlm {

// Encodes like llama.cpp's SPM tokenizer: optional dummy-prefix space, spaces written as
// "▁" (U+2581), then starting from single characters, repeatedly merge the adjacent pair
// whose concatenation is a normal or user-defined token of highest score (ties: leftmost).
// Pieces left that are not tokens become byte tokens "<0xAB>", else unk. No Unicode
// normalization (llama.cpp does none either). Invalid UTF-8 bytes count as characters
// of their own, so they fall back to byte tokens.
class SpmTokenizer final : public Tokenizer {
 public:
  // `vocab` is validated and has token types (see Tokenizer::create).
  static Result<std::unique_ptr<Tokenizer>> create(TokenizerVocab vocab);

  std::string token_to_piece(TokenId id) const override;

 private:
  explicit SpmTokenizer(TokenizerVocab vocab);

  void encode_text(std::string_view text, bool after_special, std::vector<TokenId>* out) const override;
  bool strips_first_space() const override { return vocab_.add_space_prefix; }

  // Merges one segment of escaped text and appends its ids.
  void merge_segment(std::string_view text, std::vector<TokenId>* out) const;
  // Appends the token for a final piece, or its bytes' fallback tokens.
  void append_piece(std::string_view piece, std::vector<TokenId>* out) const;

  static size_t pair_index(char before, char after) {
    return (static_cast<size_t>(static_cast<uint8_t>(before)) << 8) | static_cast<uint8_t>(after);
  }
  // False when no mergeable piece has a character ending in byte `before` followed by
  // one starting with byte `after`: no merge can ever cross such a boundary.
  bool may_join(char before, char after) const { return joinable_pairs_.test(pair_index(before, after)); }

  // Texts that merging may produce or that a final piece may be: normal, undefined and
  // user-defined tokens (never "<s>" or "<0x41>" spelled out in the input).
  std::unordered_map<std::string_view, TokenId> piece_ids_;
  std::array<TokenId, 256> byte_ids_{};  // fallback token per byte: its own, else unk, else -1
  int num_bytes_without_token_ = 0;
  std::bitset<256 * 256> joinable_pairs_;  // pair_index values seen inside mergeable pieces
  std::vector<std::string> pieces_;      // token_to_piece per id, precomputed
};

}  // namespace kvlm
