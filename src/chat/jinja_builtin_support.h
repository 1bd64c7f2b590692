// Helpers the built-in filters and the str/dict methods share (internal to chat/).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "chat/jinja_builtins.h"
#include "chat/jinja_value.h"
#include "chat/python_text.h"
#include "core/status.h"

namespace kvlm::chat::jinja_support {

inline Status type_error(std::string_view what) { return Status::errorf("TypeError: {}", what); }

// str(v) for filters that stringify their input (undefined -> "").
inline Result<std::string> text_of(const JinjaValue& v) { return to_python_str(v); }

inline Result<int64_t> int_arg(const JinjaValue* v, int64_t fallback, std::string_view what) {
  if (!v || v->is_none()) return fallback;
  if (v->is_int() || v->is_bool()) return v->as_int();
  return type_error(fmt::format("{} must be an integer, not {}", what, v->type_name()));
}

inline Status check_size(size_t bytes) {
  if (bytes > kMaxJinjaValueBytes) {
    return Status::errorf("a value the template builds exceeds the {} MiB cap", kMaxJinjaValueBytes >> 20);
  }
  return Status();
}

// Python str.splitlines(): every line break Python knows, "\r\n" as one.
inline std::vector<std::string> python_splitlines(std::string_view text) {
  std::vector<std::string> lines;
  std::string current;
  const std::vector<char32_t> cps = to_code_points(text);
  for (size_t i = 0; i < cps.size(); ++i) {
    const char32_t c = cps[i];
    const bool is_break = c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1C && c <= 0x1E) || c == 0x85 ||
                          c == 0x2028 || c == 0x2029;
    if (!is_break) {
      current += from_code_point(c);
      continue;
    }
    if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
    lines.push_back(std::move(current));
    current.clear();
  }
  if (!current.empty()) lines.push_back(std::move(current));
  return lines;
}

}  // namespace kvlm::chat::jinja_support
