// JinjaValue: a run-time value of the Jinja interpreter, with Python's semantics for printing,
// truthiness, equality and ordering (what jinja2 inherits from the Python objects it holds).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace kvlm::chat {

class JinjaValue;
struct JinjaCallArgs;

// A Python dict: insertion-ordered, string keys only (all that chat templates use).
using JinjaDict = std::vector<std::pair<std::string, JinjaValue>>;
using JinjaList = std::vector<JinjaValue>;
// A built-in function, bound method or macro; the evaluator passes itself through `args`.
using JinjaFunction = std::function<Result<JinjaValue>(JinjaCallArgs& args)>;

class JinjaValue {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kTuple, kDict, kNamespace, kFunction };

  JinjaValue() = default;  // undefined
  static JinjaValue undefined(std::string hint = "");  // hint: jinja2's message when it is used
  static JinjaValue none();
  static JinjaValue boolean(bool b);
  static JinjaValue integer(int64_t i);
  static JinjaValue floating(double d);
  static JinjaValue string(std::string s);
  static JinjaValue list(JinjaList items);
  static JinjaValue tuple(JinjaList items);
  static JinjaValue dict(JinjaDict items);
  static JinjaValue make_namespace(JinjaDict items);  // namespace(): the one mutable object
  static JinjaValue function(std::string name, JinjaFunction fn);
  static JinjaValue from_json(const nlohmann::json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }  // Python int, bool excluded
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_sequence() const { return kind_ == Kind::kList || kind_ == Kind::kTuple; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_function() const { return kind_ == Kind::kFunction; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::kBool ? (b_ ? 1 : 0) : i_; }  // bool or int
  double as_double() const { return kind_ == Kind::kFloat ? d_ : static_cast<double>(as_int()); }
  const std::string& as_string() const { return *s_; }
  const JinjaList& as_list() const { return *list_; }  // list or tuple
  const JinjaDict& as_dict() const { return *dict_; }  // dict or namespace
  JinjaDict& namespace_items() const { return *dict_; }  // namespaces are shared and mutable
  const JinjaFunction& as_function() const { return *fn_; }
  // Containers nested inside this value as it was built (0 for a scalar, 1 for [1, 2]). A
  // namespace's attributes may change later, but they never hold a namespace (the evaluator
  // refuses it: that is how a namespace could hold itself), so the true depth stays within this
  // plus one attribute value's, which the evaluator caps.
  int depth() const { return depth_; }
  bool holds_namespace() const { return holds_namespace_; }  // is one or contains one
  const std::string& function_name() const { return *s_; }
  const std::string& undefined_hint() const { return *s_; }

  // Dict / namespace lookup; nullptr when the key is absent.
  const JinjaValue* find(std::string_view key) const;

  // Python's bool(x); undefined is false.
  bool truthy() const;
  // Python's type name, as error messages show it ("str", "int", "list", "dict", ...).
  std::string type_name() const;

  // Python's == (1 == 1.0 == True; list and dict compare deeply; undefined equals only undefined).
  friend bool operator==(const JinjaValue& a, const JinjaValue& b);

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  int64_t i_ = 0;
  double d_ = 0;
  std::shared_ptr<const std::string> s_;  // string, function name or undefined hint
  std::shared_ptr<const JinjaList> list_;
  std::shared_ptr<JinjaDict> dict_;        // mutable only through namespace_items()
  std::shared_ptr<const JinjaFunction> fn_;
  int depth_ = 0;
  bool holds_namespace_ = false;

  template <typename Items>
  void note_children(const Items& items);
};

// str(x) as jinja2 prints it: strings raw, undefined "", True/False/None, Python float repr,
// lists / dicts / tuples as Python repr. Errors for functions (their repr holds an address).
Result<std::string> to_python_str(const JinjaValue& v);
// repr(x): strings quoted the way Python quotes them.
Result<std::string> to_python_repr(const JinjaValue& v);
// repr(float): the shortest round-tripping digits, Python's layout (1e+16, 1e-05, 2.0, inf).
std::string python_float_repr(double d);

// Python's < for numbers, strings (code point order = UTF-8 byte order) and sequences;
// a TypeError Status for other pairs.
Result<bool> python_less(const JinjaValue& a, const JinjaValue& b);

// Arguments of a call, filter or test, as Python binds them.
struct JinjaCallArgs {
  std::vector<JinjaValue> positional;
  std::vector<std::pair<std::string, JinjaValue>> keywords;

  // The argument at `index` or named `name`; nullptr when neither was passed.
  const JinjaValue* get(size_t index, std::string_view name) const;
  size_t size() const { return positional.size() + keywords.size(); }
};

// json.dumps(x, ensure_ascii=False, indent, separators, sort_keys), HF's tojson.
struct JsonDumpOptions {
  int indent = -1;  // -1: None (one line)
  std::string item_separator;  // empty: Python's default for the indent mode
  std::string key_separator;
  bool has_separators = false;
  bool sort_keys = false;
};
Result<std::string> python_json_dumps(const JinjaValue& v, const JsonDumpOptions& options);

}  // namespace kvlm::chat
