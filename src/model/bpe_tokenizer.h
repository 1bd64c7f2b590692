// BpeTokenizer: byte-level BPE tokenizer (GGUF model "gpt2"): regex pre-tokenizer, then merges by rank.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <unordered_map>

#include "model/tokenizer.h"
#include "model/unicode_regex.h"

namespace kvlm {

// The pre-tokenizer regex families kvlm knows, chosen from tokenizer.ggml.pre.
enum class BpePreTokenizer {
  kGpt2,    // 's|'t|...| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ ("gpt2", "default", unknown types)
  kLlama3,  // Llama 3: case-insensitive contractions, digits in groups of 1..3, "ignore merges"
  kQwen2,   // Llama 3's pattern with single digits
};

// The PCRE2 pattern of a pre-tokenizer family (for tests and diagnostics).
std::string_view bpe_pre_tokenizer_pattern(BpePreTokenizer pre_tokenizer);

// Encodes like llama.cpp / HF byte-level BPE: split the text with the pre-tokenizer
// regex; within each piece, each byte becomes its GPT-2 "byte-to-unicode" symbol, then
// the adjacent pair with the lowest merge rank is merged repeatedly (ties: leftmost).
// With kLlama3 a piece that is already a whole token is emitted as is ("ignore_merges").
// A byte whose symbol is not a token encodes as unk (or nothing when there is none).
class BpeTokenizer final : public Tokenizer {
 public:
  // `vocab` is validated and has token types (see Tokenizer::create). Errors on malformed
  // merges; unknown pre types and merges of absent tokens become warnings().
  static Result<std::unique_ptr<Tokenizer>> create(TokenizerVocab vocab);

  std::string token_to_piece(TokenId id) const override;

  BpePreTokenizer pre_tokenizer() const { return pre_tokenizer_; }

 private:
  struct Merge {
    int32_t rank = 0;
    TokenId merged = -1;
  };

  BpeTokenizer(TokenizerVocab vocab, BpePreTokenizer pre_tokenizer, UnicodeRegex regex);

  void encode_text(std::string_view text, bool after_special, std::vector<TokenId>* out) const override;
  Status parse_merges();

  static uint64_t pair_key(TokenId left, TokenId right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }

  BpePreTokenizer pre_tokenizer_;
  UnicodeRegex regex_;
  std::unordered_map<uint64_t, Merge> merges_;  // (left id, right id) -> rank and result
  std::array<TokenId, 256> byte_ids_{};        // token of each byte's symbol, -1 when absent
  std::vector<std::string> pieces_;            // token_to_piece per id, precomputed
};

}  // namespace kvlm
