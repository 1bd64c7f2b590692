// Strict UTF-8 helpers for the tokenizers: validation that tolerates invalid bytes, and encoding.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kvlm {

// Length (1..4) of the well-formed UTF-8 sequence starting at text[pos], or 0 when the
// bytes there are not one (stray continuation byte, truncated or overlong sequence,
// surrogate, or a code point above U+10FFFF). Tokenizers treat such a byte as a
// character of its own so that any byte string can be encoded. Requires pos < size.
size_t utf8_sequence_length(std::string_view text, size_t pos);

// Decodes the sequence of `length` bytes at text[pos] that utf8_sequence_length accepted.
char32_t utf8_decode(std::string_view text, size_t pos, size_t length);

// Appends the UTF-8 encoding of a code point (<= U+10FFFF, not a surrogate).
void append_utf8(char32_t code_point, std::string* out);

// True when every byte of `text` belongs to a well-formed sequence.
bool is_valid_utf8(std::string_view text);

}  // namespace kvlm
