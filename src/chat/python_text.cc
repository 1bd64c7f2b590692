// Python str semantics over UTF-8 bytes.
#include "chat/python_text.h"

#include <algorithm>

#include "model/unicode_utf8.h"

namespace kvlm::chat {

bool python_is_space(char32_t cp) {
  // Python's str.isspace(): bidirectional class WS, B or S, or category Zs.
  if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F)) return true;
  if (cp < 0x80) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

std::vector<char32_t> to_code_points(std::string_view text) {
  std::vector<char32_t> cps;
  cps.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t len = utf8_sequence_length(text, pos);
    if (len == 0) {
      cps.push_back(0xDC80 + static_cast<unsigned char>(text[pos]));
      pos += 1;
    } else {
      cps.push_back(utf8_decode(text, pos, len));
      pos += len;
    }
  }
  return cps;
}

std::string from_code_point(char32_t cp) {
  std::string out;
  if (cp >= 0xDC80 && cp <= 0xDCFF) {
    out.push_back(static_cast<char>(cp - 0xDC80));  // a byte that was not UTF-8 comes back as itself
  } else if (cp >= 0xD800 && cp <= 0xDFFF) {
    append_utf8(0xFFFD, &out);  // a lone surrogate (from a "\ud800" escape) has no UTF-8 form
  } else {
    append_utf8(cp, &out);
  }
  return out;
}

std::string from_code_points(const std::vector<char32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end && i < cps.size(); ++i) out += from_code_point(cps[i]);
  return out;
}

size_t python_len(std::string_view text) {
  size_t n = 0, pos = 0;
  while (pos < text.size()) {
    const size_t len = utf8_sequence_length(text, pos);
    pos += len == 0 ? 1 : len;
    ++n;
  }
  return n;
}

std::string python_strip(std::string_view text, const std::optional<std::string>& chars, StripSide side) {
  const std::vector<char32_t> cps = to_code_points(text);
  std::vector<char32_t> strip_set;
  if (chars) strip_set = to_code_points(*chars);
  auto strippable = [&](char32_t cp) {
    if (!chars) return python_is_space(cp);
    for (char32_t c : strip_set) {
      if (c == cp) return true;
    }
    return false;
  };
  size_t begin = 0, end = cps.size();
  if (side != StripSide::kRight) {
    while (begin < end && strippable(cps[begin])) ++begin;
  }
  if (side != StripSide::kLeft) {
    while (end > begin && strippable(cps[end - 1])) --end;
  }
  return from_code_points(cps, begin, end);
}

namespace {

// Splits on runs of whitespace, at most maxsplit times from the left (or right when reversed).
std::vector<std::string> split_whitespace(std::string_view text, int64_t maxsplit, bool from_right) {
  std::vector<char32_t> cps = to_code_points(text);
  if (from_right) std::reverse(cps.begin(), cps.end());
  std::vector<std::string> parts;
  size_t i = 0;
  const size_t n = cps.size();
  while (i < n) {
    while (i < n && python_is_space(cps[i])) ++i;
    if (i == n) break;
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
      size_t end = n;
      while (end > i && python_is_space(cps[end - 1])) --end;
      std::vector<char32_t> rest(cps.begin() + i, cps.begin() + end);
      if (from_right) std::reverse(rest.begin(), rest.end());
      parts.push_back(from_code_points(rest, 0, rest.size()));
      break;
    }
    const size_t start = i;
    while (i < n && !python_is_space(cps[i])) ++i;
    std::vector<char32_t> word(cps.begin() + start, cps.begin() + i);
    if (from_right) std::reverse(word.begin(), word.end());
    parts.push_back(from_code_points(word, 0, word.size()));
  }
  if (from_right) std::reverse(parts.begin(), parts.end());
  return parts;
}

}  // namespace

std::vector<std::string> python_split(std::string_view text, const std::optional<std::string>& sep,
                                      int64_t maxsplit) {
  if (!sep) return split_whitespace(text, maxsplit, false);
  std::vector<std::string> parts;
  size_t pos = 0;
  while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
    const size_t found = text.find(*sep, pos);
    if (found == std::string_view::npos) break;
    parts.emplace_back(text.substr(pos, found - pos));
    pos = found + sep->size();
  }
  parts.emplace_back(text.substr(pos));
  return parts;
}

std::vector<std::string> python_rsplit(std::string_view text, const std::optional<std::string>& sep,
                                       int64_t maxsplit) {
  if (!sep) return split_whitespace(text, maxsplit, true);
  if (maxsplit < 0) return python_split(text, sep, maxsplit);
  std::vector<std::string> parts;
  size_t end = text.size();
  while (static_cast<int64_t>(parts.size()) < maxsplit && end >= sep->size()) {
    const size_t found = text.rfind(*sep, end - sep->size());
    if (found == std::string_view::npos) break;
    parts.emplace_back(text.substr(found + sep->size(), end - found - sep->size()));
    end = found;
  }
  parts.emplace_back(text.substr(0, end));
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::string python_replace(std::string_view text, std::string_view old_text, std::string_view new_text,
                           int64_t count) {
  std::string out;
  if (old_text.empty()) {
    // Python inserts `new` before every code point and at the end.
    const std::vector<char32_t> cps = to_code_points(text);
    int64_t done = 0;
    for (char32_t cp : cps) {
      if (count < 0 || done < count) {
        out += new_text;
        ++done;
      }
      out += from_code_point(cp);
    }
    if (count < 0 || done < count) out += new_text;
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t found = text.find(old_text, pos);
    if (found == std::string_view::npos) break;
    out += text.substr(pos, found - pos);
    out += new_text;
    pos = found + old_text.size();
    ++done;
  }
  out += text.substr(pos);
  return out;
}

namespace {

// Simple case pairs for the scripts chat content commonly uses; 0 when there is none.
char32_t upper_of(char32_t cp) {
  if (cp >= 'a' && cp <= 'z') return cp - 32;
  if (cp == 0xB5) return 0x39C;
  if ((cp >= 0xE0 && cp <= 0xFE && cp != 0xF7)) return cp - 32;
  if (cp == 0xFF) return 0x178;
  if (cp >= 0x100 && cp <= 0x17F && cp != 0x130 && cp != 0x131 && cp != 0x138 && cp != 0x149 && cp != 0x17F) {
    const bool odd_is_lower = !((cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E));
    if (odd_is_lower ? (cp % 2 == 1) : (cp % 2 == 0)) return cp - 1;
    return 0;
  }
  if (cp >= 0x3B1 && cp <= 0x3C9 && cp != 0x3C2) return cp - 32;
  if (cp == 0x3C2) return 0x3A3;
  if (cp >= 0x430 && cp <= 0x44F) return cp - 32;
  if (cp >= 0x450 && cp <= 0x45F) return cp - 80;
  return 0;
}

char32_t lower_of(char32_t cp) {
  if (cp >= 'A' && cp <= 'Z') return cp + 32;
  if (cp >= 0xC0 && cp <= 0xDE && cp != 0xD7) return cp + 32;
  if (cp == 0x178) return 0xFF;
  if (cp >= 0x100 && cp <= 0x17F && cp != 0x130 && cp != 0x131 && cp != 0x138 && cp != 0x149 && cp != 0x17F) {
    const bool odd_is_lower = !((cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E));
    if (odd_is_lower ? (cp % 2 == 0) : (cp % 2 == 1)) return cp + 1;
    return 0;
  }
  if (cp >= 0x391 && cp <= 0x3A9 && cp != 0x3A2) return cp + 32;
  if (cp >= 0x410 && cp <= 0x42F) return cp + 32;
  if (cp >= 0x400 && cp <= 0x40F) return cp + 80;
  return 0;
}

void append_upper(char32_t cp, std::string* out) {
  if (cp == 0xDF) {  // ß has no single upper-case letter: Python writes "SS"
    *out += "SS";
    return;
  }
  const char32_t up = upper_of(cp);
  *out += from_code_point(up ? up : cp);
}

void append_lower(char32_t cp, std::string* out) {
  const char32_t low = lower_of(cp);
  *out += from_code_point(low ? low : cp);
}

bool is_cased(char32_t cp) { return upper_of(cp) != 0 || lower_of(cp) != 0 || cp == 0xDF; }

}  // namespace

std::string python_case(std::string_view text, CaseMode mode) {
  const std::vector<char32_t> cps = to_code_points(text);
  std::string out;
  out.reserve(text.size());
  bool previous_cased = false;
  for (size_t i = 0; i < cps.size(); ++i) {
    const char32_t cp = cps[i];
    switch (mode) {
      case CaseMode::kUpper: append_upper(cp, &out); break;
      case CaseMode::kLower: append_lower(cp, &out); break;
      case CaseMode::kCapitalize:
        if (i == 0) {
          append_upper(cp, &out);
        } else {
          append_lower(cp, &out);
        }
        break;
      case CaseMode::kTitle:
        if (previous_cased) {
          append_lower(cp, &out);
        } else {
          append_upper(cp, &out);
        }
        previous_cased = is_cased(cp);
        break;
    }
  }
  return out;
}

}  // namespace kvlm::chat
