// BpePreTokenizer: how a byte-level BPE vocabulary cuts text into words before merging (tokenizer.ggml.pre).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "model/unicode_regex.h"

namespace kvlm {

// The Unicode normalization a model's own tokenizer.json applies before pre-tokenizing.
// GGUF stores no normalizer, so it is a property of the pre-tokenizer type (see below).
enum class TextNormalization {
  kNone,
  kNfc,  // canonical composition: "e" + U+0301 -> "é", Hangul jamo -> syllables
};

// One pre-tokenizer type of tokenizer.ggml.pre, written from the model's tokenizer.json:
// a Sequence of Split pre-tokenizers with behaviour "Isolated" (every match is a word and
// so is every run between matches), each applied to the words of the one before, then
// ByteLevel without a regex of its own. GPT-2's "ByteLevel use_regex: true" is the same as
// one Split with GPT-2's pattern.
//
// Types (the tokenizer.ggml.pre names of each) -> stages; normalization; ignore merges:
//   gpt2 (default, gpt2, gpt-2, phi-2, olmo)           -> GPT-2's pattern; none; no
//   llama3 (llama3, llama-v3, llama-bpe, falcon3, pixtral) -> Llama 3's (digits 1..3); none; yes
//   qwen2 (qwen2, deepseek-r1-qwen, megrez)            -> Llama 3's with single digits; NFC; no
//   deepseek-v3 (deepseek-v3)                          -> digits 1..3, CJK/kana runs, words; none; no
//   gpt-4o (gpt-4o)                                    -> o200k: case-aware words, digits 1..3; none; no
//   tekken (tekken)                                    -> o200k's words without contractions, single digits; none; no
//   smollm (smollm, starcoder)                         -> single digits, then GPT-2's; none; no
//   deepseek-llm (deepseek-llm)     -> each \r/\n, listed cased letters, ASCII/CJK punctuation,
//                                      trailing spaces, CJK/Hangul runs, single digits; none; no
//   deepseek-coder (deepseek-coder) -> each \r/\n, \p{L} runs, \p{P} runs, CJK/Hangul runs,
//                                      single digits; none; no
//   falcon (falcon)                 -> punctuation runs, GPT-2's, numeric-byte runs, digit
//                                      triples; none; no
//   cl100k (dbrx, smaug-bpe, chatglm-bpe)              -> Llama 3's (digits 1..3); none; no
//   gpt-neox (mpt)                                     -> GPT-2's pattern; NFC; no
//   stablelm2 (stablelm2)                              -> Llama 3's with single digits; none; no
//   command-r (command-r)                              -> single digits, then GPT-2's; NFC; no
//   bloom (bloom)                                      -> " ?" and a run of non-space, non-
//                                                         sentence-punctuation; none; no
//
// A stage usually matches code points; falcon's numeric-byte stage matches bytes (see
// bpe_pre_tokenizer.cc), so its words may end inside a UTF-8 character.
//
// llama3, qwen2 and deepseek-v3 are checked token for token against the models' own
// encoders (tests/model/tokenizer_reference_test.cc); the others are their tokenizer.json
// patterns, unchecked by a reference. Any other name is an error, never GPT-2 by default:
// among them names that GGUF files do carry but whose tokenizer.json rule is not known here
// for certain (jais, refact, codeshell, exaone, minerva-7b, poro-chat, viking, gpt3-finnish,
// jina-v2-*, chameleon, kimi-k2).
class BpePreTokenizer {
 public:
  // The type `gguf_pre` names. "" (files from converters older than the field) is GPT-2,
  // as the format defines, and sets `warning`; an unknown name is an error listing the known.
  static Result<BpePreTokenizer> create(std::string_view gguf_pre, std::string* warning);

  // Every tokenizer.ggml.pre value create() accepts, comma-separated (for messages).
  static std::string known_names();

  BpePreTokenizer(BpePreTokenizer&&) noexcept;
  BpePreTokenizer& operator=(BpePreTokenizer&&) noexcept;
  ~BpePreTokenizer();

  // Appends the words of `text` (already normalized), views into it, in order; their
  // concatenation is `text`. Any bytes are accepted (see UnicodeRegex::split).
  void split(std::string_view text, std::vector<std::string_view>* words) const;

  const std::string& type() const { return type_; }  // the canonical type, e.g. "llama3"
  TextNormalization normalization() const { return normalization_; }
  // Llama 3's tokenizer.json "ignore_merges": a word that is itself a token is emitted whole.
  bool ignore_merges() const { return ignore_merges_; }
  const std::vector<UnicodeRegex>& stages() const { return stages_; }

 private:
  BpePreTokenizer() = default;

  std::string type_;
  std::vector<UnicodeRegex> stages_;
  TextNormalization normalization_ = TextNormalization::kNone;
  bool ignore_merges_ = false;
};

}  // namespace kvlm
