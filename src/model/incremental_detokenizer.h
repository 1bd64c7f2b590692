// IncrementalDetokenizer: token ids -> valid UTF-8 text as they are generated, O(piece) per token.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/ids.h"
#include "model/tokenizer.h"

namespace kvlm {

// Repairs a byte stream into valid UTF-8 as it arrives, the WHATWG "UTF-8 decode" way:
// every maximal subpart of an ill-formed sequence (Unicode ch. 3, "U+FFFD Substitution of
// Maximal Subparts") becomes one U+FFFD, so F0 9F 98 41 gives FFFD 'A' and C0 80 gives
// FFFD FFFD. Bytes of a sequence that may still complete are held back, at most 3.
class Utf8StreamRepair {
 public:
  // Appends to `out` what `bytes` completes.
  void append(std::string_view bytes, std::string* out);
  // Ends the stream: a held-back incomplete sequence becomes one U+FFFD.
  void finish(std::string* out);

 private:
  void reset_sequence();

  std::array<char, 3> held_{};  // lead byte and continuations seen of the open sequence
  uint8_t num_held_ = 0;
  uint8_t num_needed_ = 0;      // bytes the open sequence has in all (0: none open)
  // Range the next continuation byte must fall in; narrower than 80..BF only right after
  // E0, ED, F0 and F4, which is how overlongs, surrogates and > U+10FFFF are refused early.
  uint8_t lower_ = 0x80;
  uint8_t upper_ = 0xBF;
};

// `text` with every ill-formed sequence replaced as Utf8StreamRepair does; valid input
// comes back unchanged.
std::string sanitize_utf8(std::string_view text);

// Streams the text of a growing token sequence. The concatenation of set_prompt(),
// every push() and finish() equals sanitize_utf8(tokenizer.decode(all tokens)): the
// tokenizer's leading-space rule is applied once, where decode applies it, and bytes of
// a character split across tokens come out with the token that completes it.
// Not thread-safe; one per sequence. The tokenizer must outlive it.
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}

  // Starts a new sequence with `prompt` (may be empty) and returns its text so far.
  std::string set_prompt(std::span<const TokenId> prompt);

  // Text that token `id` completes; may be empty while a character is incomplete.
  std::string push(TokenId id);

  // Ends the sequence; returns U+FFFD when it ended inside a character, else "".
  // push() afterwards is a bug; set_prompt() starts over.
  std::string finish();

  // Everything returned so far (prompt included).
  const std::string& text() const { return text_; }

 private:
  // The bytes token `id` prints at this point of the sequence.
  std::string piece(TokenId id);

  const Tokenizer& tokenizer_;
  Utf8StreamRepair repair_;
  // decode() strips one leading space from the first token that is not a control token
  // (only where the tokenizer has that rule); true until such a token has been pushed.
  bool before_first_printed_ = true;
  bool finished_ = false;
  std::string text_;
};

}  // namespace kvlm
