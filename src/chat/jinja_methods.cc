// The Python str and dict methods templates call (message.content.startswith(...)), and the
// globals range, namespace, dict, raise_exception and strftime_now.
#include <algorithm>
#include <cstdio>
#include <ctime>

#include <fmt/format.h>

#include "chat/jinja_builtin_support.h"
#include "chat/jinja_builtins.h"
#include "chat/python_text.h"

namespace kvlm::chat {
namespace {

using Kind = JinjaValue::Kind;
using namespace jinja_support;


Result<JinjaValue> string_method(const std::string& s, std::string_view name, JinjaCallArgs& args) {
  auto str_arg = [&](size_t i, std::string_view arg_name) -> Result<std::optional<std::string>> {
    const JinjaValue* v = args.get(i, arg_name);
    if (!v || v->is_none()) return std::optional<std::string>();
    if (!v->is_string()) return type_error(fmt::format("{}() argument must be str, not {}", name, v->type_name()));
    return std::optional<std::string>(v->as_string());
  };
  if (name == "startswith" || name == "endswith") {
    const JinjaValue* v = args.get(0, "prefix");
    if (!v) return type_error(fmt::format("{}() takes at least 1 argument", name));
    std::vector<std::string> candidates;
    if (v->is_string()) {
      candidates.push_back(v->as_string());
    } else if (v->kind() == Kind::kTuple) {
      for (const JinjaValue& c : v->as_list()) {
        if (!c.is_string()) return type_error("tuple for startswith must only contain str");
        candidates.push_back(c.as_string());
      }
    } else {
      return type_error(fmt::format("{} first arg must be str or a tuple of str, not {}", name, v->type_name()));
    }
    for (const std::string& c : candidates) {
      const bool hit = name == "startswith" ? s.compare(0, c.size(), c) == 0 && s.size() >= c.size()
                                            : s.size() >= c.size() && s.compare(s.size() - c.size(), c.size(), c) == 0;
      if (hit) return JinjaValue::boolean(true);
    }
    return JinjaValue::boolean(false);
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    KVLM_ASSIGN_OR_RETURN(std::optional<std::string> chars, str_arg(0, "chars"));
    const StripSide side = name == "strip" ? StripSide::kBoth : name == "lstrip" ? StripSide::kLeft : StripSide::kRight;
    return JinjaValue::string(python_strip(s, chars, side));
  }
  if (name == "split" || name == "rsplit") {
    KVLM_ASSIGN_OR_RETURN(std::optional<std::string> sep, str_arg(0, "sep"));
    if (sep && sep->empty()) return Status::error("ValueError: empty separator");
    KVLM_ASSIGN_OR_RETURN(int64_t maxsplit, int_arg(args.get(1, "maxsplit"), -1, "maxsplit"));
    JinjaList parts;
    for (std::string& p : name == "split" ? python_split(s, sep, maxsplit) : python_rsplit(s, sep, maxsplit)) {
      parts.push_back(JinjaValue::string(std::move(p)));
    }
    return JinjaValue::list(std::move(parts));
  }
  if (name == "splitlines") {
    JinjaList parts;
    for (std::string& p : python_splitlines(s)) parts.push_back(JinjaValue::string(std::move(p)));
    return JinjaValue::list(std::move(parts));
  }
  if (name == "replace") {
    KVLM_ASSIGN_OR_RETURN(std::optional<std::string> old_text, str_arg(0, "old"));
    KVLM_ASSIGN_OR_RETURN(std::optional<std::string> new_text, str_arg(1, "new"));
    if (!old_text || !new_text) return type_error("replace() takes at least 2 arguments");
    KVLM_ASSIGN_OR_RETURN(int64_t count, int_arg(args.get(2, "count"), -1, "count"));
    std::string out = python_replace(s, *old_text, *new_text, count);
    KVLM_RETURN_IF_ERROR(check_size(out.size()));
    return JinjaValue::string(std::move(out));
  }
  if (name == "upper") return JinjaValue::string(python_case(s, CaseMode::kUpper));
  if (name == "lower") return JinjaValue::string(python_case(s, CaseMode::kLower));
  if (name == "title") return JinjaValue::string(python_case(s, CaseMode::kTitle));
  if (name == "capitalize") return JinjaValue::string(python_case(s, CaseMode::kCapitalize));
  if (name == "find" || name == "rfind" || name == "count" || name == "index" || name == "rindex") {
    KVLM_ASSIGN_OR_RETURN(std::optional<std::string> sub, str_arg(0, "sub"));
    if (!sub) return type_error(fmt::format("{}() takes at least 1 argument", name));
    if (name == "count") {
      if (sub->empty()) return JinjaValue::integer(static_cast<int64_t>(python_len(s)) + 1);
      int64_t n = 0;
      for (size_t pos = s.find(*sub); pos != std::string::npos; pos = s.find(*sub, pos + sub->size())) ++n;
      return JinjaValue::integer(n);
    }
    const size_t pos = (name == "find" || name == "index") ? s.find(*sub) : s.rfind(*sub);
    if (pos == std::string::npos) {
      if (name == "index" || name == "rindex") return Status::error("ValueError: substring not found");
      return JinjaValue::integer(-1);
    }
    return JinjaValue::integer(static_cast<int64_t>(python_len(std::string_view(s).substr(0, pos))));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    KVLM_ASSIGN_OR_RETURN(std::optional<std::string> affix, str_arg(0, "prefix"));
    if (!affix) return type_error(fmt::format("{}() takes exactly one argument", name));
    if (name == "removeprefix" && s.compare(0, affix->size(), *affix) == 0 && s.size() >= affix->size()) {
      return JinjaValue::string(s.substr(affix->size()));
    }
    if (name == "removesuffix" && !affix->empty() && s.size() >= affix->size() &&
        s.compare(s.size() - affix->size(), affix->size(), *affix) == 0) {
      return JinjaValue::string(s.substr(0, s.size() - affix->size()));
    }
    return JinjaValue::string(s);
  }
  if (name == "join") {
    JinjaCallArgs join_args;
    join_args.positional.push_back(JinjaValue::string(s));
    const JinjaValue* items = args.get(0, "iterable");
    if (!items) return type_error("join() takes exactly one argument");
    KVLM_ASSIGN_OR_RETURN(JinjaList list, jinja_iterate(*items));
    for (const JinjaValue& item : list) {
      if (!item.is_string()) return type_error(fmt::format("sequence item: expected str instance, {} found", item.type_name()));
    }
    return apply_filter("join", *items, join_args);
  }
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "islower" ||
      name == "isupper") {
    const std::vector<char32_t> cps = to_code_points(s);
    if (name == "islower" || name == "isupper") {
      KVLM_ASSIGN_OR_RETURN(bool r, apply_test(name.substr(2), JinjaValue::string(s), args));
      return JinjaValue::boolean(r);
    }
    if (cps.empty()) return JinjaValue::boolean(false);
    for (char32_t c : cps) {
      const bool digit = c >= '0' && c <= '9';
      const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
      bool ok = false;
      if (name == "isdigit") ok = digit;
      if (name == "isalpha") ok = alpha;
      if (name == "isalnum") ok = alpha || digit;
      if (name == "isspace") ok = python_is_space(c);
      if (!ok) return JinjaValue::boolean(false);
    }
    return JinjaValue::boolean(true);
  }
  return Status::errorf("unsupported construct: str.{}()", name);
}

Result<JinjaValue> dict_method(const JinjaValue& d, std::string_view name, JinjaCallArgs& args) {
  if (name == "items") {
    JinjaList pairs;
    for (const auto& [k, v] : d.as_dict()) pairs.push_back(JinjaValue::tuple({JinjaValue::string(k), v}));
    return JinjaValue::list(std::move(pairs));
  }
  if (name == "keys") {
    JinjaList keys;
    for (const auto& [k, v] : d.as_dict()) keys.push_back(JinjaValue::string(k));
    return JinjaValue::list(std::move(keys));
  }
  if (name == "values") {
    JinjaList values;
    for (const auto& [k, v] : d.as_dict()) values.push_back(v);
    return JinjaValue::list(std::move(values));
  }
  if (name == "get") {
    const JinjaValue* key = args.get(0, "key");
    const JinjaValue* fallback = args.get(1, "default");
    if (!key) return type_error("get expected at least 1 argument, got 0");
    if (key->is_string()) {
      if (const JinjaValue* v = d.find(key->as_string())) return *v;
    }
    return fallback ? *fallback : JinjaValue::none();
  }
  return Status::errorf("unsupported construct: dict.{}()", name);
}

bool is_string_method(std::string_view name) {
  static const char* const kNames[] = {"startswith", "endswith", "strip", "lstrip", "rstrip", "split", "rsplit",
                                       "splitlines", "replace", "upper", "lower", "title", "capitalize", "find",
                                       "rfind", "count", "index", "rindex", "removeprefix", "removesuffix", "join",
                                       "isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper", "format",
                                       "zfill", "center", "ljust", "rjust", "partition", "rpartition", "casefold",
                                       "swapcase", "expandtabs", "encode"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

bool is_dict_method(std::string_view name) {
  static const char* const kNames[] = {"items", "keys", "values", "get", "copy", "pop", "popitem",
                                       "setdefault", "update", "clear", "fromkeys"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

Result<JinjaValue> builtin_range(JinjaCallArgs& args) {
  if (!args.keywords.empty() || args.positional.empty() || args.positional.size() > 3) {
    return type_error("range expected 1 to 3 integer arguments");
  }
  int64_t v[3] = {0, 0, 1};
  for (size_t i = 0; i < args.positional.size(); ++i) {
    KVLM_ASSIGN_OR_RETURN(v[i], int_arg(&args.positional[i], 0, "range() argument"));
  }
  int64_t start = 0, stop = v[0], step = 1;
  if (args.positional.size() >= 2) {
    start = v[0];
    stop = v[1];
  }
  if (args.positional.size() == 3) step = v[2];
  if (step == 0) return Status::error("ValueError: range() arg 3 must not be zero");
  const long double count_ld = step > 0 ? (static_cast<long double>(stop) - start + step - 1) / step
                                        : (static_cast<long double>(start) - stop - step - 1) / -step;
  const int64_t count = count_ld > 0 ? static_cast<int64_t>(count_ld) : 0;
  if (count > kMaxJinjaRange) {
    return Status::errorf("OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE ({}).",
                          kMaxJinjaRange);
  }
  JinjaList items;
  items.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) items.push_back(JinjaValue::integer(start + i * step));
  return JinjaValue::list(std::move(items));
}

Result<JinjaValue> builtin_namespace(JinjaCallArgs& args, bool as_namespace) {
  JinjaDict items;
  for (const JinjaValue& p : args.positional) {
    if (!p.is_dict()) return type_error("namespace()/dict() positional arguments must be mappings");
    for (const auto& entry : p.as_dict()) items.push_back(entry);
  }
  for (const auto& [k, v] : args.keywords) {
    // A named copy for the lambda: clang 14 cannot capture a structured binding.
    const auto& key = k;
    auto it = std::find_if(items.begin(), items.end(), [&](const auto& e) { return e.first == key; });
    if (it != items.end()) {
      it->second = v;
    } else {
      items.emplace_back(k, v);
    }
  }
  return as_namespace ? JinjaValue::make_namespace(std::move(items)) : JinjaValue::dict(std::move(items));
}

}  // namespace

std::optional<JinjaValue> builtin_method(const JinjaValue& object, std::string_view name) {
  if (object.is_string() && is_string_method(name)) {
    JinjaValue self = object;
    std::string method(name);
    return JinjaValue::function("str." + method, [self, method](JinjaCallArgs& args) {
      return string_method(self.as_string(), method, args);
    });
  }
  if (object.is_dict() && is_dict_method(name)) {
    JinjaValue self = object;
    std::string method(name);
    return JinjaValue::function("dict." + method, [self, method](JinjaCallArgs& args) {
      return dict_method(self, method, args);
    });
  }
  return std::nullopt;
}

std::optional<JinjaValue> builtin_global(std::string_view name) {
  if (name == "range") return JinjaValue::function("range", builtin_range);
  if (name == "namespace") {
    return JinjaValue::function("namespace", [](JinjaCallArgs& args) { return builtin_namespace(args, true); });
  }
  if (name == "dict") {
    return JinjaValue::function("dict", [](JinjaCallArgs& args) { return builtin_namespace(args, false); });
  }
  if (name == "raise_exception") {
    return JinjaValue::function("raise_exception", [](JinjaCallArgs& args) -> Result<JinjaValue> {
      std::string message;
      if (const JinjaValue* m = args.get(0, "message")) {
        KVLM_ASSIGN_OR_RETURN(message, to_python_str(*m));
      }
      return Status::errorf("{}{}", kRaisedExceptionPrefix, message);
    });
  }
  if (name == "strftime_now") {
    return JinjaValue::function("strftime_now", [](JinjaCallArgs& args) -> Result<JinjaValue> {
      const JinjaValue* format = args.get(0, "format");
      if (!format || !format->is_string()) return type_error("strftime_now needs a format string");
      const std::time_t now = std::time(nullptr);
      std::tm local{};
      localtime_r(&now, &local);
      char buf[512];
      const size_t n = std::strftime(buf, sizeof(buf), format->as_string().c_str(), &local);
      return JinjaValue::string(std::string(buf, n));
    });
  }
  return std::nullopt;
}

}  // namespace kvlm::chat
