// SpmVocab: a SentencePiece-style vocabulary as GGUF stores it, plus a deterministic synthetic one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/token_type.h"

namespace kvlm {

class GgufWriter;

// Ids every vocabulary written here uses: <unk> 0, <s> 1, </s> 2, then <0x00>..<0xFF> at 3..258.
inline constexpr int32_t kSpmUnkId = 0;
inline constexpr int32_t kSpmBosId = 1;
inline constexpr int32_t kSpmEosId = 2;
inline constexpr int kSpmNumByteTokens = 256;
inline constexpr int kSpmFirstPieceId = 3 + kSpmNumByteTokens;
// The smallest synthetic vocabulary: specials, bytes, and the lone space piece "▁".
inline constexpr int kSynthMinVocabSize = kSpmFirstPieceId + 1;

// Parallel arrays, one entry per token id. Pieces use "▁" (U+2581) for spaces.
struct SpmVocab {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> token_types;  // TokenType values

  int size() const { return static_cast<int>(tokens.size()); }
};

// True for the byte-fallback piece form "<0xAB>" (two upper- or lower-case hex digits).
bool is_spm_byte_piece(const std::string& piece);

// Writes tokenizer.ggml.{model "llama", tokens, scores, token_type, bos/eos/unk ids,
// add_bos_token true, add_space_prefix true}.
void add_spm_vocab_metadata(GgufWriter& writer, const SpmVocab& vocab);

// A valid vocabulary of exactly vocab_size tokens: specials, the 256 byte tokens, then
// distinct printable pieces (the space piece, single characters, "▁"+letter, common words,
// then letter n-grams with and without "▁") with scores 0, -1, -2, ... in that order.
// The same size always gives the same vocabulary. Errors below kSynthMinVocabSize.
Result<SpmVocab> make_synthetic_vocab(int vocab_size);

}  // namespace kvlm
