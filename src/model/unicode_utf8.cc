#include "model/unicode_utf8.h"

#include <cstdint>

#include "core/check.h"

namespace kvlm {

size_t utf8_sequence_length(std::string_view text, size_t pos) {
  const size_t remaining = text.size() - pos;
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[pos + i]); };
  const uint8_t lead = byte(0);
  if (lead < 0x80) return 1;
  const auto continuation = [&](size_t i) { return i < remaining && (byte(i) & 0xC0) == 0x80; };
  // Ranges of the second byte follow the Unicode "well-formed byte sequences" table, which
  // excludes overlong forms (E0 80..9F, F0 80..8F), surrogates (ED A0..BF) and > U+10FFFF.
  if (lead >= 0xC2 && lead <= 0xDF) return continuation(1) ? 2 : 0;
  if (lead >= 0xE0 && lead <= 0xEF) {
    if (remaining < 3 || !continuation(1) || !continuation(2)) return 0;
    const uint8_t second = byte(1);
    if (lead == 0xE0 && second < 0xA0) return 0;
    if (lead == 0xED && second > 0x9F) return 0;
    return 3;
  }
  if (lead >= 0xF0 && lead <= 0xF4) {
    if (remaining < 4 || !continuation(1) || !continuation(2) || !continuation(3)) return 0;
    const uint8_t second = byte(1);
    if (lead == 0xF0 && second < 0x90) return 0;
    if (lead == 0xF4 && second > 0x8F) return 0;
    return 4;
  }
  return 0;  // 0x80..0xC1 (continuation or overlong lead) and 0xF5..0xFF never start a sequence
}

char32_t utf8_decode(std::string_view text, size_t pos, size_t length) {
  const auto byte = [&](size_t i) { return static_cast<char32_t>(static_cast<uint8_t>(text[pos + i])); };
  switch (length) {
    case 1: return byte(0);
    case 2: return ((byte(0) & 0x1F) << 6) | (byte(1) & 0x3F);
    case 3: return ((byte(0) & 0x0F) << 12) | ((byte(1) & 0x3F) << 6) | (byte(2) & 0x3F);
    case 4:
      return ((byte(0) & 0x07) << 18) | ((byte(1) & 0x3F) << 12) | ((byte(2) & 0x3F) << 6) | (byte(3) & 0x3F);
    default: KVLM_CHECK(false, "utf8_decode of a {}-byte sequence", length);
  }
  return 0;
}

void append_utf8(char32_t cp, std::string* out) {
  KVLM_CHECK(cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF), "not a Unicode scalar value: U+{:X}",
             static_cast<uint32_t>(cp));
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_valid_utf8(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<uint8_t>(text[pos]) < 0x80) {  // ASCII fast path
      ++pos;
      continue;
    }
    const size_t length = utf8_sequence_length(text, pos);
    if (length == 0) return false;
    pos += length;
  }
  return true;
}

}  // namespace kvlm
