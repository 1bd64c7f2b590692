// UnicodeRegex: a compiled PCRE2 pattern (UTF + Unicode properties) that splits text into pieces.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace kvlm {

// What one unit of a pattern's subject is.
enum class RegexUnit {
  kCodePoint,  // UTF-8 characters with Unicode properties (\p{L}, \s as Unicode defines them)
  kByte,       // raw bytes: "\xB2" is the byte 0xB2, and a piece may end inside a UTF-8 character
};

// Splits text the way a BPE pre-tokenizer does: every match is a piece, and so is any
// run of text between matches. Any byte string is accepted: in code-point patterns, bytes
// that are not valid UTF-8 are matched as if they were a punctuation-like character
// (neither \s, \p{L} nor \p{N}), which is how llama.cpp's U+FFFD replacement behaves, but
// the pieces keep the original bytes. Thread-safe: the compiled pattern is immutable.
class UnicodeRegex {
 public:
  // Compiles with PCRE2_UTF | PCRE2_UCP for kCodePoint, with neither for kByte (and JIT
  // when available); errors name the pattern.
  static Result<UnicodeRegex> compile(std::string pattern, RegexUnit unit = RegexUnit::kCodePoint);

  UnicodeRegex(UnicodeRegex&&) noexcept;
  UnicodeRegex& operator=(UnicodeRegex&&) noexcept;
  ~UnicodeRegex();

  // Appends views into `text`, in order; their concatenation is `text`.
  void split(std::string_view text, std::vector<std::string_view>* pieces) const;

  const std::string& pattern() const { return pattern_; }
  RegexUnit unit() const { return unit_; }

 private:
  struct Compiled;
  UnicodeRegex(std::string pattern, RegexUnit unit, std::unique_ptr<Compiled> compiled);

  std::string pattern_;
  RegexUnit unit_ = RegexUnit::kCodePoint;
  std::unique_ptr<Compiled> compiled_;
};

}  // namespace kvlm
