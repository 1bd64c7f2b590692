// Jinja built-ins: filters and tests, and the item/attribute lookup rules.
#include "chat/jinja_builtins.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include <fmt/format.h>

#include "chat/jinja_builtin_support.h"
#include "chat/python_text.h"

namespace kvlm::chat {
namespace {

using Kind = JinjaValue::Kind;
using namespace jinja_support;

std::optional<std::string> optional_string(const JinjaValue* v) {
  if (!v || v->is_none() || v->is_undefined()) return std::nullopt;
  if (v->is_string()) return v->as_string();
  return std::nullopt;
}

// jinja2's attribute path for filters: "a.b.0" looks up each part in turn.
Result<JinjaValue> lookup_path(const JinjaValue& item, std::string_view path) {
  JinjaValue current = item;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t dot = path.find('.', start);
    const std::string_view part = path.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    JinjaValue key = numeric ? JinjaValue::integer(std::strtoll(std::string(part).c_str(), nullptr, 10))
                             : JinjaValue::string(std::string(part));
    KVLM_ASSIGN_OR_RETURN(current, jinja_getitem(current, key));
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return current;
}

JinjaValue lowered_for_compare(const JinjaValue& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return JinjaValue::string(python_case(v.as_string(), CaseMode::kLower));
  return v;
}

Result<JinjaValue> filter_sort(const JinjaValue& input, const JinjaCallArgs& args) {
  KVLM_ASSIGN_OR_RETURN(JinjaList items, jinja_iterate(input));
  const JinjaValue* reverse = args.get(0, "reverse");
  const JinjaValue* case_sensitive = args.get(1, "case_sensitive");
  const JinjaValue* attribute = args.get(2, "attribute");
  std::vector<std::pair<JinjaValue, JinjaValue>> keyed;
  for (const JinjaValue& item : items) {
    JinjaValue key = item;
    if (attribute && attribute->is_string()) {
      KVLM_ASSIGN_OR_RETURN(key, lookup_path(item, attribute->as_string()));
    }
    keyed.emplace_back(lowered_for_compare(key, case_sensitive && case_sensitive->truthy()), item);
  }
  Status failure;
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    if (!failure.ok()) return false;
    Result<bool> less = python_less(a.first, b.first);
    if (!less.ok()) {
      failure = less.status();
      return false;
    }
    return *less;
  });
  KVLM_RETURN_IF_ERROR(failure);
  JinjaList out;
  for (auto& [k, v] : keyed) out.push_back(v);
  if (reverse && reverse->truthy()) std::reverse(out.begin(), out.end());
  return JinjaValue::list(std::move(out));
}

// select / reject / selectattr / rejectattr.
Result<JinjaValue> filter_select(const JinjaValue& input, const JinjaCallArgs& args, bool by_attribute, bool keep) {
  KVLM_ASSIGN_OR_RETURN(JinjaList items, jinja_iterate(input));
  size_t next = 0;
  std::string attribute;
  if (by_attribute) {
    if (args.positional.empty() || !args.positional[0].is_string()) {
      return type_error("selectattr/rejectattr need an attribute name");
    }
    attribute = args.positional[0].as_string();
    next = 1;
  }
  std::optional<std::string> test_name;
  if (next < args.positional.size()) {
    if (!args.positional[next].is_string()) return type_error("the test name must be a string");
    test_name = args.positional[next].as_string();
  }
  JinjaCallArgs test_args;
  for (size_t i = next + 1; i < args.positional.size(); ++i) test_args.positional.push_back(args.positional[i]);
  JinjaList out;
  for (const JinjaValue& item : items) {
    JinjaValue subject = item;
    if (by_attribute) {
      KVLM_ASSIGN_OR_RETURN(subject, lookup_path(item, attribute));
    }
    bool passed = subject.truthy();
    if (test_name) {
      KVLM_ASSIGN_OR_RETURN(passed, apply_test(*test_name, subject, test_args));
    }
    if (passed == keep) out.push_back(item);
  }
  return JinjaValue::list(std::move(out));
}

Result<JinjaValue> filter_map(const JinjaValue& input, const JinjaCallArgs& args) {
  KVLM_ASSIGN_OR_RETURN(JinjaList items, jinja_iterate(input));
  JinjaList out;
  if (const JinjaValue* attribute = args.get(99, "attribute")) {
    const JinjaValue* fallback = args.get(99, "default");
    if (!attribute->is_string()) return type_error("map(attribute=...) needs a string");
    for (const JinjaValue& item : items) {
      KVLM_ASSIGN_OR_RETURN(JinjaValue v, lookup_path(item, attribute->as_string()));
      if (v.is_undefined() && fallback) v = *fallback;
      out.push_back(v);
    }
    return JinjaValue::list(std::move(out));
  }
  if (args.positional.empty() || !args.positional[0].is_string()) return type_error("map needs a filter name or attribute=");
  JinjaCallArgs filter_args;
  filter_args.positional.assign(args.positional.begin() + 1, args.positional.end());
  filter_args.keywords = args.keywords;
  for (const JinjaValue& item : items) {
    KVLM_ASSIGN_OR_RETURN(JinjaValue v, apply_filter(args.positional[0].as_string(), item, filter_args));
    out.push_back(v);
  }
  return JinjaValue::list(std::move(out));
}

Result<JinjaValue> filter_round(const JinjaValue& input, const JinjaCallArgs& args) {
  KVLM_ASSIGN_OR_RETURN(int64_t precision, int_arg(args.get(0, "precision"), 0, "precision"));
  const JinjaValue* method_arg = args.get(1, "method");
  const std::string method = method_arg && method_arg->is_string() ? method_arg->as_string() : "common";
  if (!input.is_number()) return type_error(fmt::format("type {} doesn't define __round__ method", input.type_name()));
  if (method != "common" && method != "floor" && method != "ceil") {
    return Status::error("FilterArgumentError: method must be common, ceil or floor");
  }
  if (method == "common" && !input.is_float()) return JinjaValue::integer(input.as_int());
  const double x = input.as_double();
  if (method != "common") {
    const double scale = std::pow(10.0, static_cast<double>(precision));
    return JinjaValue::floating((method == "floor" ? std::floor(x * scale) : std::ceil(x * scale)) / scale);
  }
  if (!std::isfinite(x) || precision > 300) return JinjaValue::floating(x);
  if (precision < 0) {
    const double scale = std::pow(10.0, static_cast<double>(-precision));
    return JinjaValue::floating(std::nearbyint(x / scale) * scale);
  }
  // printf rounds the exact binary value half-to-even, as Python's round() does.
  char buf[512];
  std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(precision), x);
  return JinjaValue::floating(std::strtod(buf, nullptr));
}

Result<JinjaValue> filter_indent(const JinjaValue& input, const JinjaCallArgs& args) {
  KVLM_ASSIGN_OR_RETURN(std::string s, text_of(input));
  const JinjaValue* width = args.get(0, "width");
  std::string indention(4, ' ');
  if (width && width->is_string()) {
    indention = width->as_string();
  } else if (width) {
    KVLM_ASSIGN_OR_RETURN(int64_t w, int_arg(width, 4, "width"));
    indention = std::string(static_cast<size_t>(std::clamp<int64_t>(w, 0, 1 << 20)), ' ');
  }
  const JinjaValue* first = args.get(1, "first");
  const JinjaValue* blank = args.get(2, "blank");
  s += "\n";
  std::vector<std::string> lines = python_splitlines(s);
  std::string rv;
  if (blank && blank->truthy()) {
    for (size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + indention : "") + lines[i];
  } else if (!lines.empty()) {
    rv = lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      if (!lines[i].empty()) rv += indention;
      rv += lines[i];
      KVLM_RETURN_IF_ERROR(check_size(rv.size()));
    }
  }
  if (first && first->truthy()) rv = indention + rv;
  return JinjaValue::string(std::move(rv));
}

bool is_word_char(char32_t c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         (c >= 0xAA && !python_is_space(c) && !(c >= 0x2000 && c <= 0x206F) && !(c >= 0x3000 && c <= 0x303F) &&
          !(c >= 0xFF00 && c <= 0xFF0F) && c != 0xD7 && c != 0xF7);
}

Result<JinjaValue> python_int_of(const JinjaValue& input, const JinjaValue& fallback, int64_t base) {
  if (input.is_int() || input.is_bool()) return JinjaValue::integer(input.as_int());
  if (input.is_float()) {
    const double d = input.as_double();
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return fallback;
    return JinjaValue::integer(static_cast<int64_t>(d));
  }
  if (!input.is_string()) return fallback;
  std::string s = python_strip(input.as_string(), std::nullopt, StripSide::kBoth);
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  if (s.empty()) return fallback;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, static_cast<int>(base));
  if (end && *end == '\0' && errno == 0) return JinjaValue::integer(v);
  const double d = std::strtod(s.c_str(), &end);  // jinja2 retries int(float(value))
  if (end && *end == '\0' && std::isfinite(d) && std::fabs(d) < 9.2e18) return JinjaValue::integer(static_cast<int64_t>(d));
  return fallback;
}

Result<JinjaValue> python_float_of(const JinjaValue& input, const JinjaValue& fallback) {
  if (input.is_number()) return JinjaValue::floating(input.as_double());
  if (!input.is_string()) return fallback;
  const std::string s = python_strip(input.as_string(), std::nullopt, StripSide::kBoth);
  if (s.empty()) return fallback;
  char* end = nullptr;
  const double d = std::strtod(s.c_str(), &end);
  if (end && *end == '\0' && s.find_first_of("xXpP") == std::string::npos) return JinjaValue::floating(d);
  return fallback;
}

Result<JinjaValue> filter_join(const JinjaValue& input, const JinjaCallArgs& args) {
  KVLM_ASSIGN_OR_RETURN(JinjaList items, jinja_iterate(input));
  const JinjaValue* sep = args.get(0, "d");
  const JinjaValue* attribute = args.get(1, "attribute");
  std::string separator;
  if (sep) {
    KVLM_ASSIGN_OR_RETURN(separator, text_of(*sep));
  }
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    JinjaValue item = items[i];
    if (attribute && attribute->is_string()) {
      KVLM_ASSIGN_OR_RETURN(item, lookup_path(item, attribute->as_string()));
    }
    KVLM_ASSIGN_OR_RETURN(std::string text, text_of(item));
    if (i) out += separator;
    out += text;
    KVLM_RETURN_IF_ERROR(check_size(out.size()));
  }
  return JinjaValue::string(std::move(out));
}

Result<JinjaValue> filter_tojson(const JinjaValue& input, const JinjaCallArgs& args) {
  JsonDumpOptions options;
  if (const JinjaValue* indent = args.get(1, "indent"); indent && !indent->is_none()) {
    KVLM_ASSIGN_OR_RETURN(int64_t n, int_arg(indent, -1, "indent"));
    options.indent = static_cast<int>(std::clamp<int64_t>(n, 0, 64));
  }
  if (const JinjaValue* separators = args.get(2, "separators"); separators && !separators->is_none()) {
    if (!separators->is_sequence() || separators->as_list().size() != 2 || !separators->as_list()[0].is_string() ||
        !separators->as_list()[1].is_string()) {
      return type_error("separators must be a pair of strings");
    }
    options.has_separators = true;
    options.item_separator = separators->as_list()[0].as_string();
    options.key_separator = separators->as_list()[1].as_string();
  }
  if (const JinjaValue* sort_keys = args.get(3, "sort_keys")) options.sort_keys = sort_keys->truthy();
  if (const JinjaValue* ensure_ascii = args.get(0, "ensure_ascii"); ensure_ascii && ensure_ascii->truthy()) {
    return Status::error("unsupported construct: tojson(ensure_ascii=true)");
  }
  KVLM_ASSIGN_OR_RETURN(std::string text, python_json_dumps(input, options));
  KVLM_RETURN_IF_ERROR(check_size(text.size()));
  return JinjaValue::string(std::move(text));
}

std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

Result<JinjaValue> python_length(const JinjaValue& input) {
  switch (input.kind()) {
    case Kind::kUndefined: return JinjaValue::integer(0);
    case Kind::kString: return JinjaValue::integer(static_cast<int64_t>(python_len(input.as_string())));
    case Kind::kList:
    case Kind::kTuple: return JinjaValue::integer(static_cast<int64_t>(input.as_list().size()));
    case Kind::kDict: return JinjaValue::integer(static_cast<int64_t>(input.as_dict().size()));
    default: return type_error(fmt::format("object of type '{}' has no len()", input.type_name()));
  }
}

Result<JinjaValue> min_max(const JinjaValue& input, const JinjaCallArgs& args, bool want_max) {
  KVLM_ASSIGN_OR_RETURN(JinjaList items, jinja_iterate(input));
  if (items.empty()) return JinjaValue::undefined("No aggregated item, sequence was empty.");
  const JinjaValue* case_sensitive = args.get(0, "case_sensitive");
  const JinjaValue* attribute = args.get(1, "attribute");
  const bool cs = case_sensitive && case_sensitive->truthy();
  JinjaValue best = items[0];
  JinjaValue best_key;
  KVLM_ASSIGN_OR_RETURN(best_key, attribute && attribute->is_string() ? lookup_path(best, attribute->as_string()) : Result<JinjaValue>(best));
  best_key = lowered_for_compare(best_key, cs);
  for (size_t i = 1; i < items.size(); ++i) {
    JinjaValue key = items[i];
    if (attribute && attribute->is_string()) {
      KVLM_ASSIGN_OR_RETURN(key, lookup_path(items[i], attribute->as_string()));
    }
    key = lowered_for_compare(key, cs);
    KVLM_ASSIGN_OR_RETURN(bool better, want_max ? python_less(best_key, key) : python_less(key, best_key));
    if (better) {
      best = items[i];
      best_key = key;
    }
  }
  return best;
}

}  // namespace

Status undefined_error(const JinjaValue& v) {
  const std::string& hint = v.is_undefined() && v.undefined_hint().size() ? v.undefined_hint() : "value is undefined";
  return Status::errorf("UndefinedError: {}", hint);
}

Result<JinjaValue> jinja_getitem(const JinjaValue& object, const JinjaValue& key) {
  switch (object.kind()) {
    case Kind::kUndefined: return undefined_error(object);
    case Kind::kDict:
    case Kind::kNamespace:
      if (key.is_string()) {
        if (const JinjaValue* v = object.find(key.as_string())) return *v;
        if (object.is_dict()) {
          if (auto method = builtin_method(object, key.as_string())) return *method;
        }
      }
      break;
    case Kind::kList:
    case Kind::kTuple:
      if (key.is_int() || key.is_bool()) {
        const JinjaList& items = object.as_list();
        int64_t i = key.as_int();
        if (i < 0) i += static_cast<int64_t>(items.size());
        if (i >= 0 && i < static_cast<int64_t>(items.size())) return items[static_cast<size_t>(i)];
        return JinjaValue::undefined(fmt::format("{} object has no element {}", object.type_name(), key.as_int()));
      }
      break;
    case Kind::kString:
      if (key.is_int() || key.is_bool()) {
        const std::vector<char32_t> cps = to_code_points(object.as_string());
        int64_t i = key.as_int();
        if (i < 0) i += static_cast<int64_t>(cps.size());
        if (i >= 0 && i < static_cast<int64_t>(cps.size())) return JinjaValue::string(from_code_point(cps[static_cast<size_t>(i)]));
        return JinjaValue::undefined(fmt::format("str object has no element {}", key.as_int()));
      }
      if (key.is_string()) {
        if (auto method = builtin_method(object, key.as_string())) return *method;
      }
      break;
    default: break;
  }
  KVLM_ASSIGN_OR_RETURN(std::string key_text, to_python_repr(key));
  return JinjaValue::undefined(fmt::format("'{} object' has no attribute {}", object.type_name(), key_text));
}

Result<JinjaValue> jinja_getattr(const JinjaValue& object, std::string_view name) {
  if (object.is_undefined()) return undefined_error(object);
  // Attribute first: a dict's methods shadow its keys (message.items is the method).
  if (object.is_dict() || object.is_string()) {
    if (auto method = builtin_method(object, name)) return *method;
  }
  if (object.is_dict() || object.is_namespace()) {
    if (const JinjaValue* v = object.find(name)) return *v;
  }
  return JinjaValue::undefined(fmt::format("'{} object' has no attribute '{}'", object.type_name(), name));
}

Result<JinjaList> jinja_iterate(const JinjaValue& v) {
  switch (v.kind()) {
    case Kind::kUndefined: return JinjaList{};
    case Kind::kList:
    case Kind::kTuple: return v.as_list();
    case Kind::kDict: {
      JinjaList keys;
      for (const auto& [k, item] : v.as_dict()) keys.push_back(JinjaValue::string(k));
      return keys;
    }
    case Kind::kString: {
      JinjaList chars;
      for (char32_t cp : to_code_points(v.as_string())) chars.push_back(JinjaValue::string(from_code_point(cp)));
      return chars;
    }
    default: return type_error(fmt::format("'{}' object is not iterable", v.type_name()));
  }
}

Result<JinjaValue> apply_filter(std::string_view name, const JinjaValue& input, const JinjaCallArgs& args) {
  if (name == "trim") {
    KVLM_ASSIGN_OR_RETURN(std::string s, text_of(input));
    return JinjaValue::string(python_strip(s, optional_string(args.get(0, "chars")), StripSide::kBoth));
  }
  if (name == "tojson") return filter_tojson(input, args);
  if (name == "length" || name == "count") return python_length(input);
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    KVLM_ASSIGN_OR_RETURN(std::string s, text_of(input));
    const CaseMode mode = name == "upper" ? CaseMode::kUpper
                        : name == "lower" ? CaseMode::kLower
                        : name == "title" ? CaseMode::kTitle
                                          : CaseMode::kCapitalize;
    return JinjaValue::string(python_case(s, mode));
  }
  if (name == "default" || name == "d") {
    const JinjaValue* fallback = args.get(0, "default_value");
    const JinjaValue* boolean = args.get(1, "boolean");
    const bool use_fallback = input.is_undefined() || (boolean && boolean->truthy() && !input.truthy());
    if (use_fallback) return fallback ? *fallback : JinjaValue::string("");
    return input;
  }
  if (name == "join") return filter_join(input, args);
  if (name == "first" || name == "last") {
    KVLM_ASSIGN_OR_RETURN(JinjaList items, jinja_iterate(input));
    if (items.empty()) return JinjaValue::undefined(fmt::format("No {} item, sequence was empty.", name));
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    KVLM_ASSIGN_OR_RETURN(JinjaList items, jinja_iterate(input));
    return JinjaValue::list(std::move(items));
  }
  if (name == "items") {
    if (input.is_undefined()) return JinjaValue::list({});
    if (!input.is_dict()) return type_error("items filter needs a mapping");
    JinjaList pairs;
    for (const auto& [k, v] : input.as_dict()) pairs.push_back(JinjaValue::tuple({JinjaValue::string(k), v}));
    return JinjaValue::list(std::move(pairs));
  }
  if (name == "string") {
    KVLM_ASSIGN_OR_RETURN(std::string s, text_of(input));
    return JinjaValue::string(std::move(s));
  }
  if (name == "safe") return input;
  if (name == "escape" || name == "e") {
    KVLM_ASSIGN_OR_RETURN(std::string s, text_of(input));
    return JinjaValue::string(html_escape(s));
  }
  if (name == "int") {
    const JinjaValue* fallback = args.get(0, "default");
    KVLM_ASSIGN_OR_RETURN(int64_t base, int_arg(args.get(1, "base"), 10, "base"));
    if (base < 2 || base > 36) return Status::error("ValueError: int() base must be >= 2 and <= 36");
    return python_int_of(input, fallback ? *fallback : JinjaValue::integer(0), base);
  }
  if (name == "float") {
    const JinjaValue* fallback = args.get(0, "default");
    return python_float_of(input, fallback ? *fallback : JinjaValue::floating(0.0));
  }
  if (name == "abs") {
    if (input.is_float()) return JinjaValue::floating(std::fabs(input.as_double()));
    if (input.is_int() || input.is_bool()) {
      if (input.as_int() == INT64_MIN) return Status::error("OverflowError: integer beyond 64 bits");
      return JinjaValue::integer(std::abs(input.as_int()));
    }
    return type_error(fmt::format("bad operand type for abs(): '{}'", input.type_name()));
  }
  if (name == "round") return filter_round(input, args);
  if (name == "replace") {
    KVLM_ASSIGN_OR_RETURN(std::string s, text_of(input));
    const JinjaValue* old_v = args.get(0, "old");
    const JinjaValue* new_v = args.get(1, "new");
    if (!old_v || !new_v) return type_error("replace needs old and new");
    KVLM_ASSIGN_OR_RETURN(std::string old_text, text_of(*old_v));
    KVLM_ASSIGN_OR_RETURN(std::string new_text, text_of(*new_v));
    KVLM_ASSIGN_OR_RETURN(int64_t count, int_arg(args.get(2, "count"), -1, "count"));
    std::string out = python_replace(s, old_text, new_text, count);
    KVLM_RETURN_IF_ERROR(check_size(out.size()));
    return JinjaValue::string(std::move(out));
  }
  if (name == "selectattr") return filter_select(input, args, true, true);
  if (name == "rejectattr") return filter_select(input, args, true, false);
  if (name == "select") return filter_select(input, args, false, true);
  if (name == "reject") return filter_select(input, args, false, false);
  if (name == "map") return filter_map(input, args);
  if (name == "reverse") {
    if (input.is_string()) {
      std::vector<char32_t> cps = to_code_points(input.as_string());
      std::reverse(cps.begin(), cps.end());
      return JinjaValue::string(from_code_points(cps, 0, cps.size()));
    }
    KVLM_ASSIGN_OR_RETURN(JinjaList items, jinja_iterate(input));
    std::reverse(items.begin(), items.end());
    return JinjaValue::list(std::move(items));
  }
  if (name == "sort") return filter_sort(input, args);
  if (name == "unique") {
    KVLM_ASSIGN_OR_RETURN(JinjaList items, jinja_iterate(input));
    const JinjaValue* case_sensitive = args.get(0, "case_sensitive");
    const JinjaValue* attribute = args.get(1, "attribute");
    JinjaList out, seen;
    for (const JinjaValue& item : items) {
      JinjaValue key = item;
      if (attribute && attribute->is_string()) {
        KVLM_ASSIGN_OR_RETURN(key, lookup_path(item, attribute->as_string()));
      }
      key = lowered_for_compare(key, case_sensitive && case_sensitive->truthy());
      if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
      seen.push_back(key);
      out.push_back(item);
    }
    return JinjaValue::list(std::move(out));
  }
  if (name == "indent") return filter_indent(input, args);
  if (name == "wordcount") {
    KVLM_ASSIGN_OR_RETURN(std::string s, text_of(input));
    int64_t words = 0;
    bool in_word = false;
    for (char32_t cp : to_code_points(s)) {
      const bool w = is_word_char(cp);
      if (w && !in_word) ++words;
      in_word = w;
    }
    return JinjaValue::integer(words);
  }
  if (name == "min" || name == "max") return min_max(input, args, name == "max");
  if (name == "sum") {
    KVLM_ASSIGN_OR_RETURN(JinjaList items, jinja_iterate(input));
    const JinjaValue* attribute = args.get(0, "attribute");
    const JinjaValue* start = args.get(1, "start");
    JinjaValue total = start ? *start : JinjaValue::integer(0);
    for (const JinjaValue& item : items) {
      JinjaValue v = item;
      if (attribute && attribute->is_string()) {
        KVLM_ASSIGN_OR_RETURN(v, lookup_path(item, attribute->as_string()));
      }
      if (!total.is_number() || !v.is_number()) return type_error("sum needs numbers");
      if (total.is_float() || v.is_float()) {
        total = JinjaValue::floating(total.as_double() + v.as_double());
      } else {
        int64_t r = 0;
        if (__builtin_add_overflow(total.as_int(), v.as_int(), &r)) return Status::error("OverflowError: integer beyond 64 bits");
        total = JinjaValue::integer(r);
      }
    }
    return total;
  }
  return Status::errorf("unsupported construct: filter '{}'", name);
}

Result<bool> apply_test(std::string_view name, const JinjaValue& input, const JinjaCallArgs& args) {
  const JinjaValue* arg = args.get(0, "other");
  if (name == "defined") return !input.is_undefined();
  if (name == "undefined") return input.is_undefined();
  if (name == "none") return input.is_none();
  if (name == "string") return input.is_string();
  if (name == "number") return input.is_number();
  if (name == "integer") return input.is_int();
  if (name == "float") return input.is_float();
  if (name == "boolean") return input.is_bool();
  if (name == "true") return input.is_bool() && input.as_bool();
  if (name == "false") return input.is_bool() && !input.as_bool();
  if (name == "mapping") return input.is_dict();
  if (name == "iterable") return input.is_undefined() || input.is_string() || input.is_sequence() || input.is_dict();
  if (name == "sequence") return input.is_undefined() || input.is_string() || input.is_sequence() || input.is_dict();
  if (name == "callable") return input.is_function();
  if (name == "escaped") return false;
  if (name == "odd" || name == "even") {
    if (!input.is_int() && !input.is_bool()) {
      return type_error(fmt::format("unsupported operand type(s) for %: '{}' and 'int'", input.type_name()));
    }
    const bool odd = (input.as_int() % 2) != 0;
    return name == "odd" ? odd : !odd;
  }
  if (name == "divisibleby") {
    const JinjaValue* num = args.get(0, "num");
    if (!num || !(num->is_int() || num->is_bool()) || !(input.is_int() || input.is_bool())) {
      return type_error("divisibleby needs integers");
    }
    if (num->as_int() == 0) return Status::error("ZeroDivisionError: integer division or modulo by zero");
    return input.as_int() % num->as_int() == 0;
  }
  if (name == "lower" || name == "upper") {
    if (!input.is_string()) {
      KVLM_ASSIGN_OR_RETURN(std::string s, text_of(input));
      return apply_test(name, JinjaValue::string(s), args);
    }
    // str.islower(): at least one cased character and none of the other case.
    const std::string& s = input.as_string();
    const std::string lowered = python_case(s, CaseMode::kLower);
    const std::string uppered = python_case(s, CaseMode::kUpper);
    const bool has_cased = lowered != uppered;
    return has_cased && (name == "lower" ? s == lowered : s == uppered);
  }
  if (name == "in") {
    const JinjaValue* seq = args.get(0, "seq");
    if (!seq) return type_error("the 'in' test needs a container");
    if (seq->is_string()) {
      if (!input.is_string()) return type_error("'in <string>' requires string as left operand");
      return seq->as_string().find(input.as_string()) != std::string::npos;
    }
    if (seq->is_dict()) return input.is_string() && seq->find(input.as_string()) != nullptr;
    KVLM_ASSIGN_OR_RETURN(JinjaList items, jinja_iterate(*seq));
    return std::find(items.begin(), items.end(), input) != items.end();
  }
  if (name == "sameas") {
    if (!arg) return type_error("sameas needs an argument");
    if (input.kind() != arg->kind()) return false;
    if (input.is_none() || input.is_undefined()) return true;
    if (input.is_bool()) return input.as_bool() == arg->as_bool();
    return false;  // identity of other objects is not observable here
  }
  auto needs_arg = [&]() -> Status {
    if (!arg) return type_error(fmt::format("test '{}' needs an argument", name));
    return Status();
  };
  if (name == "eq" || name == "equalto" || name == "==") {
    KVLM_RETURN_IF_ERROR(needs_arg());
    return input == *arg;
  }
  if (name == "ne" || name == "!=") {
    KVLM_RETURN_IF_ERROR(needs_arg());
    return !(input == *arg);
  }
  if (name == "lt" || name == "lessthan" || name == "<") {
    KVLM_RETURN_IF_ERROR(needs_arg());
    return python_less(input, *arg);
  }
  if (name == "gt" || name == "greaterthan" || name == ">") {
    KVLM_RETURN_IF_ERROR(needs_arg());
    return python_less(*arg, input);
  }
  if (name == "le" || name == "<=") {
    KVLM_RETURN_IF_ERROR(needs_arg());
    KVLM_ASSIGN_OR_RETURN(bool greater, python_less(*arg, input));
    return !greater;
  }
  if (name == "ge" || name == ">=") {
    KVLM_RETURN_IF_ERROR(needs_arg());
    KVLM_ASSIGN_OR_RETURN(bool less, python_less(input, *arg));
    return !less;
  }
  return Status::errorf("unsupported construct: test '{}'", name);
}

}  // namespace kvlm::chat
