// JinjaValue: construction, Python printing, equality and ordering, json.dumps.
#include "chat/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <type_traits>
#include <cmath>

#include <fmt/format.h>

#include "chat/python_text.h"

namespace kvlm::chat {

JinjaValue JinjaValue::undefined(std::string hint) {
  JinjaValue v;
  v.s_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}
JinjaValue JinjaValue::none() {
  JinjaValue v;
  v.kind_ = Kind::kNone;
  return v;
}
JinjaValue JinjaValue::boolean(bool b) {
  JinjaValue v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}
JinjaValue JinjaValue::integer(int64_t i) {
  JinjaValue v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}
JinjaValue JinjaValue::floating(double d) {
  JinjaValue v;
  v.kind_ = Kind::kFloat;
  v.d_ = d;
  return v;
}
JinjaValue JinjaValue::string(std::string s) {
  JinjaValue v;
  v.kind_ = Kind::kString;
  v.s_ = std::make_shared<const std::string>(std::move(s));
  return v;
}
template <typename Items>
void JinjaValue::note_children(const Items& items) {
  int deepest = 0;
  for (const auto& item : items) {
    const JinjaValue* child = nullptr;
    if constexpr (std::is_same_v<Items, JinjaDict>) {
      child = &item.second;
    } else {
      child = &item;
    }
    deepest = std::max(deepest, child->depth_);
    holds_namespace_ = holds_namespace_ || child->holds_namespace_;
  }
  depth_ = deepest + 1;
}

JinjaValue JinjaValue::list(JinjaList items) {
  JinjaValue v;
  v.kind_ = Kind::kList;
  v.note_children(items);
  v.list_ = std::make_shared<const JinjaList>(std::move(items));
  return v;
}
JinjaValue JinjaValue::tuple(JinjaList items) {
  JinjaValue v = list(std::move(items));
  v.kind_ = Kind::kTuple;
  return v;
}
JinjaValue JinjaValue::dict(JinjaDict items) {
  JinjaValue v;
  v.kind_ = Kind::kDict;
  v.note_children(items);
  v.dict_ = std::make_shared<JinjaDict>(std::move(items));
  return v;
}
JinjaValue JinjaValue::make_namespace(JinjaDict items) {
  JinjaValue v = dict(std::move(items));
  v.kind_ = Kind::kNamespace;
  v.holds_namespace_ = true;
  return v;
}
JinjaValue JinjaValue::function(std::string name, JinjaFunction fn) {
  JinjaValue v;
  v.kind_ = Kind::kFunction;
  v.s_ = std::make_shared<const std::string>(std::move(name));
  v.fn_ = std::make_shared<const JinjaFunction>(std::move(fn));
  return v;
}

JinjaValue JinjaValue::from_json(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return none();
    case nlohmann::json::value_t::boolean: return boolean(j.get<bool>());
    case nlohmann::json::value_t::number_integer: return integer(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return floating(static_cast<double>(u));
      return integer(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float: return floating(j.get<double>());
    case nlohmann::json::value_t::string: return string(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      JinjaList items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e));
      return list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      JinjaDict items;
      items.reserve(j.size());
      for (const auto& [k, e] : j.items()) items.emplace_back(k, from_json(e));
      return dict(std::move(items));
    }
    default: return none();  // binary / discarded never come from parsed JSON
  }
}

const JinjaValue* JinjaValue::find(std::string_view key) const {
  if (!dict_ || (kind_ != Kind::kDict && kind_ != Kind::kNamespace)) return nullptr;
  for (const auto& [k, v] : *dict_) {
    if (k == key) return &v;
  }
  return nullptr;
}

bool JinjaValue::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return b_;
    case Kind::kInt: return i_ != 0;
    case Kind::kFloat: return d_ != 0.0;
    case Kind::kString: return !s_->empty();
    case Kind::kList:
    case Kind::kTuple: return !list_->empty();
    case Kind::kDict: return !dict_->empty();
    case Kind::kNamespace:
    case Kind::kFunction: return true;
  }
  return false;
}

std::string JinjaValue::type_name() const {
  switch (kind_) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return "list";
    case Kind::kTuple: return "tuple";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kFunction: return "function";
  }
  return "object";
}

bool operator==(const JinjaValue& a, const JinjaValue& b) {
  using Kind = JinjaValue::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString: return a.as_string() == b.as_string();
    case Kind::kList:
    case Kind::kTuple: return a.as_list() == b.as_list();
    case Kind::kDict: {
      if (a.as_dict().size() != b.as_dict().size()) return false;
      for (const auto& [k, v] : a.as_dict()) {
        const JinjaValue* other = b.find(k);
        if (!other || !(v == *other)) return false;
      }
      return true;
    }
    case Kind::kNamespace: return &a.namespace_items() == &b.namespace_items();
    case Kind::kFunction: return &a.as_function() == &b.as_function();
    default: return false;
  }
}

std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, end);  // "-1.2345e+02": shortest digits that round-trip
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e_pos = sci.find('e');
  std::string digits = sci.substr(0, e_pos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exponent = std::stoi(sci.substr(e_pos + 1));
  if (exponent < -4 || exponent >= 16) {
    std::string out = sign + digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out;
  }
  if (exponent < 0) return sign + "0." + std::string(-exponent - 1, '0') + digits;
  const size_t int_len = static_cast<size_t>(exponent) + 1;
  if (digits.size() <= int_len) return sign + digits + std::string(int_len - digits.size(), '0') + ".0";
  return sign + digits.substr(0, int_len) + "." + digits.substr(int_len);
}

namespace {

// str.isprintable() for the code points chat content holds: controls, format characters,
// separators other than ' ' and surrogates are not printable.
bool python_printable(char32_t cp) {
  if (cp < 0x20 || cp == 0x7F) return false;
  if (cp < 0x7F) return true;
  if (cp <= 0xA0 || cp == 0xAD) return false;
  if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F)) return false;
  if ((cp >= 0x205F && cp <= 0x206F) || cp == 0x3000 || cp == 0xFEFF) return false;
  if (cp >= 0xD800 && cp <= 0xDFFF) return false;
  if ((cp >= 0xE000 && cp <= 0xF8FF) || (cp >= 0xFFF0 && cp <= 0xFFFB) || cp == 0xFFFE || cp == 0xFFFF) return false;
  if (cp >= 0xF0000) return false;
  return true;
}

std::string python_string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t cp : to_code_points(s)) {
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (python_printable(cp)) {
      out += from_code_point(cp);
    } else if (cp < 0x100) {
      out += fmt::format("\\x{:02x}", static_cast<uint32_t>(cp));
    } else if (cp < 0x10000) {
      out += fmt::format("\\u{:04x}", static_cast<uint32_t>(cp));
    } else {
      out += fmt::format("\\U{:08x}", static_cast<uint32_t>(cp));
    }
  }
  out += quote;
  return out;
}

}  // namespace

Result<std::string> to_python_repr(const JinjaValue& v) {
  using Kind = JinjaValue::Kind;
  switch (v.kind()) {
    case Kind::kString: return python_string_repr(v.as_string());
    case Kind::kUndefined: return std::string();  // jinja2's Undefined repr is "Undefined"; str is ""
    case Kind::kList:
    case Kind::kTuple: {
      const bool tuple = v.kind() == Kind::kTuple;
      std::string out(1, tuple ? '(' : '[');
      const JinjaList& items = v.as_list();
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += ", ";
        KVLM_ASSIGN_OR_RETURN(std::string item, to_python_repr(items[i]));
        out += item;
      }
      if (tuple && items.size() == 1) out += ",";
      out += tuple ? ')' : ']';
      return out;
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      std::string out = v.is_namespace() ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, item] : v.as_dict()) {
        if (!first) out += ", ";
        first = false;
        KVLM_ASSIGN_OR_RETURN(std::string value, to_python_repr(item));
        out += python_string_repr(k) + ": " + value;
      }
      out += v.is_namespace() ? "}>" : "}";
      return out;
    }
    default: return to_python_str(v);
  }
}

Result<std::string> to_python_str(const JinjaValue& v) {
  using Kind = JinjaValue::Kind;
  switch (v.kind()) {
    case Kind::kUndefined: return std::string();
    case Kind::kNone: return std::string("None");
    case Kind::kBool: return std::string(v.as_bool() ? "True" : "False");
    case Kind::kInt: return std::to_string(v.as_int());
    case Kind::kFloat: return python_float_repr(v.as_double());
    case Kind::kString: return v.as_string();
    case Kind::kFunction:
      return Status::errorf("cannot print the function '{}' (Python prints its address)", v.function_name());
    default: return to_python_repr(v);
  }
}

Result<bool> python_less(const JinjaValue& a, const JinjaValue& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.kind() == b.kind() && a.is_sequence()) {
    const JinjaList& x = a.as_list();
    const JinjaList& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (x[i] == y[i]) continue;
      return python_less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  return Status::errorf("TypeError: '<' not supported between instances of '{}' and '{}'", a.type_name(),
                        b.type_name());
}

namespace {

void append_json_string(const std::string& s, std::string* out) {
  *out += '"';
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      default:
        if (u < 0x20) {
          *out += fmt::format("\\u{:04x}", static_cast<unsigned>(u));
        } else {
          *out += c;
        }
    }
  }
  *out += '"';
}

Status dump_json(const JinjaValue& v, const JsonDumpOptions& options, int depth, std::string* out) {
  using Kind = JinjaValue::Kind;
  if (depth > 512) return Status::error("ValueError: value too deeply nested for tojson");
  const bool pretty = options.indent >= 0;
  const std::string item_sep = options.has_separators ? options.item_separator : (pretty ? "," : ", ");
  const std::string key_sep = options.has_separators ? options.key_separator : ": ";
  auto newline = [&](int level) {
    if (pretty) *out += "\n" + std::string(static_cast<size_t>(options.indent) * level, ' ');
  };
  switch (v.kind()) {
    case Kind::kNone: *out += "null"; return Status();
    case Kind::kBool: *out += v.as_bool() ? "true" : "false"; return Status();
    case Kind::kInt: *out += std::to_string(v.as_int()); return Status();
    case Kind::kFloat: {
      const double d = v.as_double();
      if (std::isnan(d)) {
        *out += "NaN";
      } else if (std::isinf(d)) {
        *out += d > 0 ? "Infinity" : "-Infinity";
      } else {
        *out += python_float_repr(d);
      }
      return Status();
    }
    case Kind::kString: append_json_string(v.as_string(), out); return Status();
    case Kind::kList:
    case Kind::kTuple: {
      const JinjaList& items = v.as_list();
      if (items.empty()) {
        *out += "[]";
        return Status();
      }
      *out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) *out += item_sep;
        newline(depth + 1);
        KVLM_RETURN_IF_ERROR(dump_json(items[i], options, depth + 1, out));
      }
      newline(depth);
      *out += ']';
      return Status();
    }
    case Kind::kDict: {
      std::vector<const std::pair<std::string, JinjaValue>*> entries;
      for (const auto& entry : v.as_dict()) entries.push_back(&entry);
      if (entries.empty()) {
        *out += "{}";
        return Status();
      }
      if (options.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return a->first < b->first; });
      }
      *out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) *out += item_sep;
        newline(depth + 1);
        append_json_string(entries[i]->first, out);
        *out += key_sep;
        KVLM_RETURN_IF_ERROR(dump_json(entries[i]->second, options, depth + 1, out));
      }
      newline(depth);
      *out += '}';
      return Status();
    }
    default:
      return Status::errorf("TypeError: Object of type {} is not JSON serializable", v.type_name());
  }
}

}  // namespace

const JinjaValue* JinjaCallArgs::get(size_t index, std::string_view name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [k, v] : keywords) {
    if (k == name) return &v;
  }
  return nullptr;
}

Result<std::string> python_json_dumps(const JinjaValue& v, const JsonDumpOptions& options) {
  std::string out;
  KVLM_RETURN_IF_ERROR(dump_json(v, options, 0, &out));
  return out;
}

}  // namespace kvlm::chat
