// JinjaParser: tokens -> statement tree, following jinja2's grammar and operator precedence.
#pragma once

#include <string_view>

#include "chat/jinja_ast.h"
#include "core/status.h"

namespace kvlm::chat {

// Nesting deeper than this (expressions or blocks) is refused, so parsing and evaluation
// can never exhaust the stack on hostile input.
inline constexpr int kMaxParseDepth = 128;

// Parses normalized template source (see normalize_template_newlines). Errors name the
// line:column and the construct: syntax errors, unknown tags, and jinja2 features this
// interpreter refuses (extends, include, import, call blocks, recursive loops, *args).
Result<StmtList> parse_template(std::string_view normalized_source);

}  // namespace kvlm::chat
