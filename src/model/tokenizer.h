// Tokenizer: text <-> token ids for a GGUF vocabulary (SentencePiece-style or byte-level BPE).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/ids.h"
#include "core/status.h"
#include "model/token_type.h"
#include "model/tokenizer_special_matcher.h"

namespace kvlm {

// What a GGUF file says about its vocabulary (tokenizer.ggml.*). Parallel arrays are
// indexed by token id.
struct TokenizerVocab {
  std::string model;                 // tokenizer.ggml.model: "llama" (SentencePiece-style) or "gpt2" (byte-level BPE)
  std::string pre;                   // tokenizer.ggml.pre: "llama3"/"llama-bpe", "qwen2", "default", ... (BPE only)
  std::vector<std::string> tokens;   // tokenizer.ggml.tokens
  std::vector<float> scores;         // tokenizer.ggml.scores (may be empty; SPM merge priority)
  std::vector<int32_t> token_types;  // tokenizer.ggml.token_type, TokenType values (may be empty)
  std::vector<std::string> merges;   // tokenizer.ggml.merges, "left right" by rank (BPE)
  int32_t bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1;  // -1: none
  bool add_bos = true;               // tokenizer.ggml.add_bos_token (default: true for llama, false for gpt2)
  bool add_space_prefix = true;      // tokenizer.ggml.add_space_prefix (SPM dummy prefix)
};

// How encode treats text that spells a control token ("<|eot_id|>", "<s>"). User-defined
// tokens (Qwen's "<think>", Gemma's "<table>" and newline runs: HF's non-special added
// tokens) are matched as whole tokens in both modes, as the models' own encoders do.
// Matches are leftmost first, longest among those; SPM adds its dummy prefix again after
// each one (HF normalizes each span between added tokens on its own, as does llama.cpp).
enum class SpecialTokens {
  kAsText,  // plain text: "<s>" is encoded as the characters '<', 's', '>' (the default)
  kParse,   // spans spelling a control or unknown token become that one token too
            // (llama.cpp's parse_special; HF's encoders always do this)
};

// Immutable after create(): encode, decode and token_to_piece may run on many threads at once.
class Tokenizer {
 public:
  // Validates the vocabulary (array sizes, ids in range, token types, merge syntax) and
  // builds the tokenizer its model names. Missing token_types are inferred (bos/eos
  // control, unk unknown, "<0xAB>" byte pieces for SPM, others normal); vocab() shows them.
  static Result<std::unique_ptr<Tokenizer>> create(TokenizerVocab vocab);

  virtual ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids for `text`, which may hold any bytes (invalid UTF-8 is encoded byte-exactly
  // where the vocabulary has byte tokens). add_bos prepends bos_id() when there is one;
  // callers usually pass add_bos(). Empty text gives just the BOS (or nothing).
  std::vector<TokenId> encode(std::string_view text, bool add_bos,
                              SpecialTokens special = SpecialTokens::kAsText) const;

  // The bytes a token stands for when printed: SPM "▁" -> ' ' and "<0x0A>" -> "\n"; BPE
  // byte-level symbols mapped back to bytes; user-defined tokens as their raw text;
  // control, unknown and unused tokens and ids outside the vocabulary -> "". A piece may
  // be part of a UTF-8 character: streaming callers must buffer incomplete sequences.
  virtual std::string token_to_piece(TokenId id) const = 0;

  // Concatenated pieces of a whole sequence. SPM with add_space_prefix removes the one
  // space its dummy prefix added to the first printed token (after any leading BOS), so
  // decode(encode(text, b)) == text. Decoding a continuation separately loses its
  // leading space; streaming output should concatenate token_to_piece instead.
  std::string decode(const std::vector<TokenId>& ids) const;

  int vocab_size() const { return static_cast<int>(vocab_.tokens.size()); }
  TokenId bos_id() const { return vocab_.bos_id; }
  TokenId eos_id() const { return vocab_.eos_id; }
  bool add_bos() const { return vocab_.add_bos; }
  const TokenizerVocab& vocab() const { return vocab_; }
  TokenType token_type(TokenId id) const;  // kUndefined for ids outside the vocabulary

  // Exact lookup of a token's stored text (e.g. "<|eot_id|>"); nullopt when absent.
  std::optional<TokenId> find_token(std::string_view text) const;

  // Non-fatal findings of create(): a BPE vocabulary naming no pre-tokenizer (GPT-2's is
  // used), merges naming absent tokens, missing byte tokens. Empty when clean. The CLI
  // prints them on stderr.
  const std::vector<std::string>& warnings() const { return warnings_; }

 protected:
  explicit Tokenizer(TokenizerVocab vocab);

  // Appends the ids of one span of plain text. `after_special` is true at the start of
  // the text and right after a token split out by SpecialTokens::kParse.
  virtual void encode_text(std::string_view text, bool after_special, std::vector<TokenId>* out) const = 0;

  // True when decode should drop the leading space of the first printed token.
  virtual bool strips_first_space() const { return false; }

  void add_warning(std::string warning) { warnings_.push_back(std::move(warning)); }

  TokenizerVocab vocab_;
  // Every token's text -> id (the last id wins for duplicate texts, as in llama.cpp).
  // Keys view vocab_.tokens, which never changes after construction.
  std::unordered_map<std::string_view, TokenId> token_ids_;

 private:
  SpecialTokenMatcher special_matcher_;  // control, user-defined and unknown tokens (kParse)
  SpecialTokenMatcher user_matcher_;     // user-defined tokens only (kAsText)
  std::vector<std::string> warnings_;
};

}  // namespace kvlm
