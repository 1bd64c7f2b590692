// JinjaLexer: splits a template into data and tag tokens the way jinja2's lexer does with
// trim_blocks and lstrip_blocks (newline normalization, `-`/`+` whitespace control, comments, raw).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace kvlm::chat {

enum class JinjaTokenKind {
  kData,           // literal template text, already whitespace-controlled
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,
  kString,         // text: the decoded value
  kInteger,        // text: the digits, '_' removed
  kFloat,
  kOperator,       // text: "+", "//", "==", "(", ...
  kEnd,            // end of the template
};

struct JinjaToken {
  JinjaTokenKind kind;
  std::string text;
  size_t offset = 0;  // byte offset in the normalized source, for line:column in errors
};

// The source jinja2 actually lexes: every line break (\r\n, \r, \v, \f, \x1c-\x1e, U+0085,
// U+2028, U+2029) becomes "\n" and one trailing line break is dropped (keep_trailing_newline=False).
std::string normalize_template_newlines(std::string_view source);

// "line L, column C" (1-based, columns in bytes) of a byte offset in `source`.
std::string describe_position(std::string_view source, size_t offset);

// Tokenizes normalized source; errors name the line:column and what was wrong.
Result<std::vector<JinjaToken>> lex_template(std::string_view source);

}  // namespace kvlm::chat
