// Jinja's built-in filters, tests, globals and the Python str/dict methods templates call,
// with jinja2's and Python's semantics (argument names, Undefined handling, error cases).
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

#include "chat/jinja_value.h"
#include "core/status.h"

namespace kvlm::chat {

// Any string or list a template builds is capped at this size, so doubling tricks cannot
// exhaust memory; the rendered output has the same cap.
inline constexpr size_t kMaxJinjaValueBytes = size_t{16} << 20;
// Lists and dicts nested deeper than this are refused where a template stores a value (set) and
// in the render context: every walk over a value (printing, ==, tojson, destruction) recurses
// once per level, and a loop of `set x = [x]` would otherwise nest until the stack overflows.
// Real chat contexts (tool schemas included) stay within a few dozen levels.
inline constexpr int kMaxJinjaValueDepth = 256;
// jinja2's sandbox refuses range() longer than this (MAX_RANGE).
inline constexpr int64_t kMaxJinjaRange = 100000;

// Errors are Statuses whose message starts with the Python exception type ("TypeError: ...").
Result<JinjaValue> apply_filter(std::string_view name, const JinjaValue& input, const JinjaCallArgs& args);
Result<bool> apply_test(std::string_view name, const JinjaValue& input, const JinjaCallArgs& args);

// A bound method of a str or dict (message.content.startswith), or nullopt when `object`
// has no such method.
std::optional<JinjaValue> builtin_method(const JinjaValue& object, std::string_view name);

// range, namespace, dict, raise_exception, strftime_now; nullopt for other names.
std::optional<JinjaValue> builtin_global(std::string_view name);

// The message raise_exception's Status carries (the chat template asked to fail).
inline constexpr std::string_view kRaisedExceptionPrefix = "chat template raised an exception: ";

// The error for using an undefined value where jinja2 raises UndefinedError.
Status undefined_error(const JinjaValue& v);

// obj[key] / obj.attr with jinja2's lookup order; undefined (with a hint) when absent.
// Errors only when `object` itself is undefined.
Result<JinjaValue> jinja_getitem(const JinjaValue& object, const JinjaValue& key);
Result<JinjaValue> jinja_getattr(const JinjaValue& object, std::string_view name);

// The items `for` iterates: list/tuple items, dict keys, string characters; undefined is empty.
Result<JinjaList> jinja_iterate(const JinjaValue& v);

}  // namespace kvlm::chat
