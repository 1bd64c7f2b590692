// Python str semantics over UTF-8 bytes: whitespace (str.isspace), code-point length, indexing
// and slicing, strip/split/replace, case mapping. Jinja templates index and measure strings in
// code points, and the chat output must match Python byte for byte.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvlm::chat {

// str.isspace() for one code point.
bool python_is_space(char32_t cp);

// The code points of `text`; bytes that are not well-formed UTF-8 become one code point each
// (0xDC80 + byte, Python's surrogateescape), so nothing is ever lost.
std::vector<char32_t> to_code_points(std::string_view text);
std::string from_code_points(const std::vector<char32_t>& cps, size_t begin, size_t end);
std::string from_code_point(char32_t cp);
size_t python_len(std::string_view text);

// str.strip / lstrip / rstrip: with no chars, Python whitespace; else any of `chars`' code points.
enum class StripSide { kBoth, kLeft, kRight };
std::string python_strip(std::string_view text, const std::optional<std::string>& chars, StripSide side);

// str.split(sep, maxsplit): sep absent splits on runs of whitespace and drops empty ends.
// sep == "" is Python's ValueError: callers check first.
std::vector<std::string> python_split(std::string_view text, const std::optional<std::string>& sep,
                                      int64_t maxsplit);
std::vector<std::string> python_rsplit(std::string_view text, const std::optional<std::string>& sep,
                                       int64_t maxsplit);
// str.replace(old, new, count); count < 0 replaces every occurrence.
std::string python_replace(std::string_view text, std::string_view old_text, std::string_view new_text,
                           int64_t count);

// Case mapping. ASCII letters and the Latin-1/Latin Extended-A, Greek and Cyrillic basic
// blocks map as Python does (simple mappings); other code points are left as they are.
enum class CaseMode { kUpper, kLower, kTitle, kCapitalize };
std::string python_case(std::string_view text, CaseMode mode);

}  // namespace kvlm::chat
