// BpeTokenizer: byte-level BPE tokenizer (GGUF model "gpt2"): regex pre-tokenizer, then merges by rank.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <unordered_map>

#include "model/bpe_pre_tokenizer.h"
#include "model/tokenizer.h"

namespace kvlm {

// Encodes like HF byte-level BPE: normalize as the pre-tokenizer type says (Qwen2: NFC),
// split the text into words with its regex stages; within each word, each byte becomes its
// GPT-2 "byte-to-unicode" symbol, then the adjacent pair with the lowest merge rank is
// merged repeatedly (ties: leftmost). With "ignore merges" (Llama 3) a word that is already
// a whole token is emitted as is. A byte whose symbol is not a token encodes as unk (or
// nothing when there is none).
class BpeTokenizer final : public Tokenizer {
 public:
  // `vocab` is validated and has token types (see Tokenizer::create). Errors on malformed
  // merges and unknown pre-tokenizer types; a missing pre type, merges of absent tokens
  // and missing byte symbols become warnings().
  static Result<std::unique_ptr<Tokenizer>> create(TokenizerVocab vocab);

  std::string token_to_piece(TokenId id) const override;

  const BpePreTokenizer& pre_tokenizer() const { return pre_tokenizer_; }

 private:
  struct Merge {
    int32_t rank = 0;
    TokenId merged = -1;
  };

  BpeTokenizer(TokenizerVocab vocab, BpePreTokenizer pre_tokenizer);

  void encode_text(std::string_view text, bool after_special, std::vector<TokenId>* out) const override;
  Status parse_merges();

  static uint64_t pair_key(TokenId left, TokenId right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }

  BpePreTokenizer pre_tokenizer_;
  std::unordered_map<uint64_t, Merge> merges_;  // (left id, right id) -> rank and result
  std::array<TokenId, 256> byte_ids_{};        // token of each byte's symbol, -1 when absent
  std::vector<std::string> pieces_;            // token_to_piece per id, precomputed
};

}  // namespace kvlm
