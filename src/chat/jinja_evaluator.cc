// JinjaEvaluator: statements and expressions over JinjaValue.
#include "chat/jinja_evaluator.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include <fmt/format.h>

#include "chat/jinja_builtins.h"
#include "chat/jinja_lexer.h"
#include "chat/python_text.h"

namespace kvlm::chat {
namespace {

// Variables of one frame; lookups walk to the parent (loop body -> enclosing -> template).
struct Scope {
  std::shared_ptr<Scope> parent;
  std::unordered_map<std::string, JinjaValue> vars;

  const JinjaValue* lookup(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get()) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};
using ScopePtr = std::shared_ptr<Scope>;

ScopePtr child_of(const ScopePtr& parent) {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  return s;
}

enum class Flow { kNormal, kBreak, kContinue };

class Evaluator {
 public:
  Evaluator(std::string_view source, const JinjaValue& context, const JinjaRenderLimits& limits)
      : source_(source), context_(context), limits_(limits) {}

  Result<std::string> render(const StmtList& body) {
    auto root = std::make_shared<Scope>();
    std::string out;
    Flow flow = Flow::kNormal;
    KVLM_RETURN_IF_ERROR(exec_list(body, root, &out, &flow));
    return out;
  }

 private:
  Status at(size_t offset, const Status& status) const {
    if (status.ok()) return status;
    if (status.message().rfind(kRaisedExceptionPrefix, 0) == 0) return status;  // already final
    if (status.message().rfind("chat template error at ", 0) == 0) return status;
    return Status::errorf("chat template error at {}: {}", describe_position(source_, offset), status.message());
  }

  Status append(std::string* out, std::string_view text) const {
    if (out->size() + text.size() > limits_.max_output_bytes) {
      return Status::errorf("chat template output exceeds the {}-byte cap", limits_.max_output_bytes);
    }
    out->append(text);
    return Status();
  }

  Status exec_list(const StmtList& list, const ScopePtr& scope, std::string* out, Flow* flow) {
    for (const StmtPtr& s : list) {
      KVLM_RETURN_IF_ERROR(exec(*s, scope, out, flow));
      if (*flow != Flow::kNormal) return Status();
    }
    return Status();
  }

  Status exec(const Stmt& s, const ScopePtr& scope, std::string* out, Flow* flow) {
    switch (s.kind) {
      case StmtKind::kData: return append(out, s.text);
      case StmtKind::kOutput: {
        KVLM_ASSIGN_OR_RETURN(JinjaValue v, eval(*s.expr, scope));
        Result<std::string> text = to_python_str(v);
        if (!text.ok()) return at(s.offset, text.status());
        return append(out, *text);
      }
      case StmtKind::kIf: {
        for (size_t i = 0; i < s.conditions.size(); ++i) {
          KVLM_ASSIGN_OR_RETURN(JinjaValue cond, eval(*s.conditions[i], scope));
          if (cond.truthy()) return exec_list(s.bodies[i], scope, out, flow);
        }
        return exec_list(s.else_body, scope, out, flow);
      }
      case StmtKind::kFor: return exec_for(s, scope, out, flow);
      case StmtKind::kSet: {
        KVLM_ASSIGN_OR_RETURN(JinjaValue v, eval(*s.expr, scope));
        return assign(s, v, scope);
      }
      case StmtKind::kSetBlock: {
        std::string text;
        Flow inner = Flow::kNormal;
        KVLM_RETURN_IF_ERROR(exec_list(s.body, child_of(scope), &text, &inner));
        scope->vars[s.targets[0]] = JinjaValue::string(std::move(text));
        return Status();
      }
      case StmtKind::kMacro: {
        scope->vars[s.name] = make_macro(s, scope);
        return Status();
      }
      case StmtKind::kWith: {
        ScopePtr inner = child_of(scope);
        for (size_t i = 0; i < s.targets.size(); ++i) {
          KVLM_ASSIGN_OR_RETURN(JinjaValue v, eval(*s.values[i], scope));
          inner->vars[s.targets[i]] = v;
        }
        return exec_list(s.body, inner, out, flow);
      }
      case StmtKind::kFilterBlock: {
        std::string text;
        Flow inner_flow = Flow::kNormal;
        ScopePtr inner = child_of(scope);
        KVLM_RETURN_IF_ERROR(exec_list(s.body, inner, &text, &inner_flow));
        inner->vars[""] = JinjaValue::string(std::move(text));
        KVLM_ASSIGN_OR_RETURN(JinjaValue v, eval(*s.expr, inner));
        Result<std::string> filtered = to_python_str(v);
        if (!filtered.ok()) return at(s.offset, filtered.status());
        return append(out, *filtered);
      }
      case StmtKind::kBreak: *flow = Flow::kBreak; return Status();
      case StmtKind::kContinue: *flow = Flow::kContinue; return Status();
    }
    return Status();
  }

  // Binds `value` to the statement's targets (names, a tuple of names, or ns.attr).
  Status assign(const Stmt& s, const JinjaValue& value, const ScopePtr& scope) {
    if (value.depth() > kMaxJinjaValueDepth) {
      return at(s.offset, Status::errorf("a value the template builds is nested deeper than {} levels",
                                         kMaxJinjaValueDepth));
    }
    if (!s.attribute.empty()) {
      const JinjaValue* ns = scope->lookup(s.name);
      if (!ns || !ns->is_namespace()) {
        return at(s.offset, Status::error("TemplateRuntimeError: cannot assign attribute on non-namespace object"));
      }
      // Refused so that no namespace can come to hold itself (a cycle every walk would follow forever).
      if (value.holds_namespace()) {
        return at(s.offset, Status::error("a namespace attribute cannot hold a namespace"));
      }
      JinjaDict& items = ns->namespace_items();
      for (auto& [k, v] : items) {
        if (k == s.attribute) {
          v = value;
          return Status();
        }
      }
      items.emplace_back(s.attribute, value);
      return Status();
    }
    return bind_targets(s, value, scope.get());
  }

  Status bind_targets(const Stmt& s, const JinjaValue& value, Scope* scope) {
    if (!s.targets_are_tuple) {
      scope->vars[s.targets[0]] = value;
      return Status();
    }
    Result<JinjaList> items = jinja_iterate(value);
    if (!items.ok()) return at(s.offset, items.status());
    if (items->size() != s.targets.size()) {
      return at(s.offset, Status::errorf("ValueError: {} values to unpack (expected {}, got {})",
                                         items->size() > s.targets.size() ? "too many" : "not enough",
                                         s.targets.size(), items->size()));
    }
    for (size_t i = 0; i < s.targets.size(); ++i) scope->vars[s.targets[i]] = (*items)[i];
    return Status();
  }

  Status count_iteration(size_t offset) {
    if (++num_iterations_ > limits_.max_loop_iterations) {
      return at(offset, Status::errorf("loops ran more than {} iterations", limits_.max_loop_iterations));
    }
    return Status();
  }

  Status exec_for(const Stmt& s, const ScopePtr& scope, std::string* out, Flow* flow) {
    KVLM_ASSIGN_OR_RETURN(JinjaValue iterable, eval(*s.expr, scope));
    // A list or tuple is walked in place (`iterable` keeps it alive): copying range(100000)
    // per outer iteration was most of a nested loop's cost.
    JinjaList built;
    const JinjaList* all = &built;
    if (iterable.is_sequence()) {
      all = &iterable.as_list();
    } else {
      Result<JinjaList> iterated = jinja_iterate(iterable);
      if (!iterated.ok()) return at(s.offset, iterated.status());
      built = std::move(iterated).value();
    }
    JinjaList kept;
    if (s.filter) {
      for (const JinjaValue& item : *all) {
        KVLM_RETURN_IF_ERROR(count_iteration(s.offset));
        ScopePtr probe = child_of(scope);
        KVLM_RETURN_IF_ERROR(bind_targets(s, item, probe.get()));
        KVLM_ASSIGN_OR_RETURN(JinjaValue keep, eval(*s.filter, probe));
        if (keep.truthy()) kept.push_back(item);
      }
    }
    const JinjaList& items = s.filter ? kept : *all;
    const int64_t length = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < length; ++i) {
      KVLM_RETURN_IF_ERROR(count_iteration(s.offset));
      ScopePtr body_scope = child_of(scope);
      KVLM_RETURN_IF_ERROR(bind_targets(s, items[static_cast<size_t>(i)], body_scope.get()));
      if (s.reads_loop_variable) body_scope->vars["loop"] = make_loop(items, i);
      Flow inner = Flow::kNormal;
      KVLM_RETURN_IF_ERROR(exec_list(s.body, body_scope, out, &inner));
      if (inner == Flow::kBreak) break;
    }
    if (length == 0) return exec_list(s.else_body, child_of(scope), out, flow);
    return Status();
  }

  static JinjaValue make_loop(const JinjaList& items, int64_t i) {
    const int64_t n = static_cast<int64_t>(items.size());
    JinjaDict loop = {
        {"index0", JinjaValue::integer(i)},
        {"index", JinjaValue::integer(i + 1)},
        {"revindex0", JinjaValue::integer(n - i - 1)},
        {"revindex", JinjaValue::integer(n - i)},
        {"first", JinjaValue::boolean(i == 0)},
        {"last", JinjaValue::boolean(i == n - 1)},
        {"length", JinjaValue::integer(n)},
        {"depth", JinjaValue::integer(1)},
        {"depth0", JinjaValue::integer(0)},
        {"previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : JinjaValue::undefined("there is no previous item")},
        {"nextitem", i + 1 < n ? items[static_cast<size_t>(i + 1)] : JinjaValue::undefined("there is no next item")},
    };
    loop.emplace_back("cycle", JinjaValue::function("loop.cycle", [i](JinjaCallArgs& args) -> Result<JinjaValue> {
      if (args.positional.empty()) return Status::error("TypeError: no items for cycling given");
      return args.positional[static_cast<size_t>(i) % args.positional.size()];
    }));
    return JinjaValue::dict(std::move(loop));
  }

  JinjaValue make_macro(const Stmt& s, const ScopePtr& defining_scope) {
    const Stmt* macro = &s;
    std::weak_ptr<Scope> weak_scope = defining_scope;  // the macro lives in that scope: no cycle
    return JinjaValue::function(s.name, [this, macro, weak_scope](JinjaCallArgs& args) -> Result<JinjaValue> {
      if (args.positional.size() > macro->targets.size()) {
        return Status::errorf("TypeError: macro '{}' takes not more than {} argument(s)", macro->name,
                              macro->targets.size());
      }
      if (call_depth_ >= limits_.max_call_depth) {
        return Status::errorf("macro calls nested deeper than {} levels", limits_.max_call_depth);
      }
      ScopePtr parent = weak_scope.lock();
      ScopePtr scope = child_of(parent);
      std::vector<bool> bound(macro->targets.size(), false);
      for (size_t i = 0; i < args.positional.size(); ++i) {
        scope->vars[macro->targets[i]] = args.positional[i];
        bound[i] = true;
      }
      for (const auto& [k, v] : args.keywords) {
        auto it = std::find(macro->targets.begin(), macro->targets.end(), k);
        if (it == macro->targets.end()) {
          return Status::errorf("TypeError: macro '{}' takes no keyword argument '{}'", macro->name, k);
        }
        const size_t idx = static_cast<size_t>(it - macro->targets.begin());
        if (bound[idx]) return Status::errorf("TypeError: macro '{}' got multiple values for argument '{}'", macro->name, k);
        scope->vars[k] = v;
        bound[idx] = true;
      }
      for (size_t i = 0; i < macro->targets.size(); ++i) {
        if (bound[i]) continue;
        if (macro->values[i]) {
          KVLM_ASSIGN_OR_RETURN(scope->vars[macro->targets[i]], eval(*macro->values[i], scope));
        } else {
          scope->vars[macro->targets[i]] =
              JinjaValue::undefined(fmt::format("parameter '{}' was not provided", macro->targets[i]));
        }
      }
      ++call_depth_;
      std::string text;
      Flow flow = Flow::kNormal;
      Status status = exec_list(macro->body, scope, &text, &flow);
      --call_depth_;
      KVLM_RETURN_IF_ERROR(status);
      return JinjaValue::string(std::move(text));
    });
  }

  // ---- expressions ----

  Result<JinjaValue> lookup_name(const std::string& name, const ScopePtr& scope) const {
    if (const JinjaValue* v = scope->lookup(name)) return *v;
    if (const JinjaValue* v = context_.find(name)) return *v;
    if (auto builtin = builtin_global(name)) return *builtin;
    return JinjaValue::undefined(fmt::format("'{}' is undefined", name));
  }

  Result<JinjaCallArgs> eval_args(const Expr& e, size_t first_arg, const ScopePtr& scope) {
    JinjaCallArgs args;
    const size_t num_keywords = e.keyword_names.size();
    const size_t num_positional = e.operands.size() - first_arg - num_keywords;
    for (size_t i = 0; i < num_positional; ++i) {
      KVLM_ASSIGN_OR_RETURN(JinjaValue v, eval(*e.operands[first_arg + i], scope));
      args.positional.push_back(std::move(v));
    }
    for (size_t k = 0; k < num_keywords; ++k) {
      KVLM_ASSIGN_OR_RETURN(JinjaValue v, eval(*e.operands[first_arg + num_positional + k], scope));
      args.keywords.emplace_back(e.keyword_names[k], std::move(v));
    }
    return args;
  }

  Result<JinjaValue> eval(const Expr& e, const ScopePtr& scope) {
    Result<JinjaValue> r = eval_inner(e, scope);
    if (!r.ok()) return at(e.offset, r.status());
    return r;
  }

  Result<JinjaValue> eval_inner(const Expr& e, const ScopePtr& scope) {
    switch (e.kind) {
      case ExprKind::kConstant: return e.value;
      case ExprKind::kName: return lookup_name(e.name, scope);
      case ExprKind::kList:
      case ExprKind::kTuple: {
        JinjaList items;
        for (const ExprPtr& op : e.operands) {
          KVLM_ASSIGN_OR_RETURN(JinjaValue v, eval(*op, scope));
          items.push_back(std::move(v));
        }
        return e.kind == ExprKind::kList ? JinjaValue::list(std::move(items)) : JinjaValue::tuple(std::move(items));
      }
      case ExprKind::kDict: {
        JinjaDict items;
        for (size_t i = 0; i + 1 < e.operands.size(); i += 2) {
          KVLM_ASSIGN_OR_RETURN(JinjaValue key, eval(*e.operands[i], scope));
          KVLM_ASSIGN_OR_RETURN(JinjaValue value, eval(*e.operands[i + 1], scope));
          if (!key.is_string()) return Status::error("unsupported construct: dict keys that are not strings");
          auto it = std::find_if(items.begin(), items.end(), [&](const auto& p) { return p.first == key.as_string(); });
          if (it != items.end()) {
            it->second = std::move(value);
          } else {
            items.emplace_back(key.as_string(), std::move(value));
          }
        }
        return JinjaValue::dict(std::move(items));
      }
      case ExprKind::kGetAttr: {
        KVLM_ASSIGN_OR_RETURN(JinjaValue object, eval(*e.operands[0], scope));
        return jinja_getattr(object, e.name);
      }
      case ExprKind::kGetItem: {
        KVLM_ASSIGN_OR_RETURN(JinjaValue object, eval(*e.operands[0], scope));
        KVLM_ASSIGN_OR_RETURN(JinjaValue key, eval(*e.operands[1], scope));
        return jinja_getitem(object, key);
      }
      case ExprKind::kSlice: return eval_slice(e, scope);
      case ExprKind::kCall: {
        KVLM_ASSIGN_OR_RETURN(JinjaValue callee, eval(*e.operands[0], scope));
        if (callee.is_undefined()) return undefined_error(callee);
        if (!callee.is_function()) return Status::errorf("TypeError: '{}' object is not callable", callee.type_name());
        KVLM_ASSIGN_OR_RETURN(JinjaCallArgs args, eval_args(e, 1, scope));
        return callee.as_function()(args);
      }
      case ExprKind::kFilter: {
        KVLM_ASSIGN_OR_RETURN(JinjaValue input, eval(*e.operands[0], scope));
        KVLM_ASSIGN_OR_RETURN(JinjaCallArgs args, eval_args(e, 1, scope));
        return apply_filter(e.name, input, args);
      }
      case ExprKind::kTest: {
        KVLM_ASSIGN_OR_RETURN(JinjaValue input, eval(*e.operands[0], scope));
        KVLM_ASSIGN_OR_RETURN(JinjaCallArgs args, eval_args(e, 1, scope));
        KVLM_ASSIGN_OR_RETURN(bool passed, apply_test(e.name, input, args));
        return JinjaValue::boolean(passed != e.negated);
      }
      case ExprKind::kNot: {
        KVLM_ASSIGN_OR_RETURN(JinjaValue v, eval(*e.operands[0], scope));
        return JinjaValue::boolean(!v.truthy());
      }
      case ExprKind::kNegate:
      case ExprKind::kPlus: {
        KVLM_ASSIGN_OR_RETURN(JinjaValue v, eval(*e.operands[0], scope));
        if (v.is_undefined()) return undefined_error(v);
        if (v.is_float()) return JinjaValue::floating(e.kind == ExprKind::kNegate ? -v.as_double() : v.as_double());
        if (v.is_int() || v.is_bool()) {
          if (e.kind == ExprKind::kPlus) return JinjaValue::integer(v.as_int());
          if (v.as_int() == INT64_MIN) return Status::error("OverflowError: integer beyond 64 bits");
          return JinjaValue::integer(-v.as_int());
        }
        return Status::errorf("TypeError: bad operand type for unary {}: '{}'", e.kind == ExprKind::kNegate ? '-' : '+',
                              v.type_name());
      }
      case ExprKind::kBinary: {
        KVLM_ASSIGN_OR_RETURN(JinjaValue a, eval(*e.operands[0], scope));
        KVLM_ASSIGN_OR_RETURN(JinjaValue b, eval(*e.operands[1], scope));
        return binary_op(e.name, a, b);
      }
      case ExprKind::kCompare: {
        KVLM_ASSIGN_OR_RETURN(JinjaValue left, eval(*e.operands[0], scope));
        for (size_t i = 0; i < e.compare_ops.size(); ++i) {
          KVLM_ASSIGN_OR_RETURN(JinjaValue right, eval(*e.operands[i + 1], scope));
          KVLM_ASSIGN_OR_RETURN(bool holds, compare(e.compare_ops[i], left, right));
          if (!holds) return JinjaValue::boolean(false);
          left = std::move(right);
        }
        return JinjaValue::boolean(true);
      }
      case ExprKind::kAnd:
      case ExprKind::kOr: {
        KVLM_ASSIGN_OR_RETURN(JinjaValue left, eval(*e.operands[0], scope));
        // Python returns an operand, not a bool: "a or b" is a when a is truthy.
        if (left.truthy() == (e.kind == ExprKind::kOr)) return left;
        return eval(*e.operands[1], scope);
      }
      case ExprKind::kConditional: {
        KVLM_ASSIGN_OR_RETURN(JinjaValue cond, eval(*e.operands[1], scope));
        if (cond.truthy()) return eval(*e.operands[0], scope);
        if (e.operands[2]) return eval(*e.operands[2], scope);
        return JinjaValue::undefined("the inline if-expression on line had no else clause");
      }
    }
    return Status::error("unknown expression");
  }

  Result<JinjaValue> eval_slice(const Expr& e, const ScopePtr& scope) {
    KVLM_ASSIGN_OR_RETURN(JinjaValue object, eval(*e.operands[0], scope));
    if (object.is_undefined()) return undefined_error(object);
    std::optional<int64_t> bounds[3];
    for (int i = 0; i < 3; ++i) {
      if (!e.operands[i + 1]) continue;
      KVLM_ASSIGN_OR_RETURN(JinjaValue v, eval(*e.operands[i + 1], scope));
      if (v.is_none()) continue;
      if (!v.is_int() && !v.is_bool()) {
        return Status::error("TypeError: slice indices must be integers or None or have an __index__ method");
      }
      bounds[i] = v.as_int();
    }
    const int64_t step = bounds[2].value_or(1);
    if (step == 0) return Status::error("ValueError: slice step cannot be zero");
    std::vector<char32_t> cps;
    int64_t n = 0;
    if (object.is_string()) {
      cps = to_code_points(object.as_string());
      n = static_cast<int64_t>(cps.size());
    } else if (object.is_sequence()) {
      n = static_cast<int64_t>(object.as_list().size());
    } else {
      return JinjaValue::undefined(fmt::format("'{} object' is not subscriptable", object.type_name()));
    }
    // Python's PySlice_AdjustIndices.
    auto adjust = [&](std::optional<int64_t> v, int64_t fallback) {
      if (!v) return fallback;
      int64_t x = *v;
      if (x < 0) {
        x += n;
        if (x < 0) x = step < 0 ? -1 : 0;
      } else if (x >= n) {
        x = step < 0 ? n - 1 : n;
      }
      return x;
    };
    const int64_t start = adjust(bounds[0], step < 0 ? n - 1 : 0);
    const int64_t stop = adjust(bounds[1], step < 0 ? -1 : n);
    std::vector<int64_t> picks;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) picks.push_back(i);
    if (object.is_string()) {
      std::string out;
      for (int64_t i : picks) out += from_code_point(cps[static_cast<size_t>(i)]);
      return JinjaValue::string(std::move(out));
    }
    JinjaList items;
    for (int64_t i : picks) items.push_back(object.as_list()[static_cast<size_t>(i)]);
    return object.kind() == JinjaValue::Kind::kTuple ? JinjaValue::tuple(std::move(items))
                                                     : JinjaValue::list(std::move(items));
  }

  static Status size_check(size_t bytes) {
    if (bytes > kMaxJinjaValueBytes) {
      return Status::errorf("a value the template builds exceeds the {} MiB cap", kMaxJinjaValueBytes >> 20);
    }
    return Status();
  }

  static Status operand_error(std::string_view op, const JinjaValue& a, const JinjaValue& b) {
    if (a.is_undefined()) return undefined_error(a);
    if (b.is_undefined()) return undefined_error(b);
    return Status::errorf("TypeError: unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(),
                          b.type_name());
  }

  static Result<JinjaValue> repeat(const JinjaValue& seq, int64_t times) {
    if (times < 0) times = 0;
    if (seq.is_string()) {
      KVLM_RETURN_IF_ERROR(size_check(seq.as_string().size() * static_cast<size_t>(std::min<int64_t>(times, 1 << 30))));
      std::string out;
      for (int64_t i = 0; i < times; ++i) out += seq.as_string();
      return JinjaValue::string(std::move(out));
    }
    KVLM_RETURN_IF_ERROR(size_check(seq.as_list().size() * 16 * static_cast<size_t>(std::min<int64_t>(times, 1 << 30))));
    JinjaList out;
    for (int64_t i = 0; i < times; ++i) out.insert(out.end(), seq.as_list().begin(), seq.as_list().end());
    return seq.kind() == JinjaValue::Kind::kTuple ? JinjaValue::tuple(std::move(out)) : JinjaValue::list(std::move(out));
  }

  static Result<JinjaValue> binary_op(const std::string& op, const JinjaValue& a, const JinjaValue& b) {
    if (op == "~") {
      KVLM_ASSIGN_OR_RETURN(std::string x, to_python_str(a));
      KVLM_ASSIGN_OR_RETURN(std::string y, to_python_str(b));
      KVLM_RETURN_IF_ERROR(size_check(x.size() + y.size()));
      return JinjaValue::string(x + y);
    }
    const bool numbers = a.is_number() && b.is_number();
    const bool use_float = numbers && (a.is_float() || b.is_float());
    if (op == "+") {
      if (a.is_string() && b.is_string()) {
        KVLM_RETURN_IF_ERROR(size_check(a.as_string().size() + b.as_string().size()));
        return JinjaValue::string(a.as_string() + b.as_string());
      }
      if (a.is_sequence() && a.kind() == b.kind()) {
        KVLM_RETURN_IF_ERROR(size_check((a.as_list().size() + b.as_list().size()) * 16));
        JinjaList items = a.as_list();
        items.insert(items.end(), b.as_list().begin(), b.as_list().end());
        return a.kind() == JinjaValue::Kind::kTuple ? JinjaValue::tuple(std::move(items)) : JinjaValue::list(std::move(items));
      }
    }
    if (op == "*" && (a.is_string() || a.is_sequence()) && (b.is_int() || b.is_bool())) return repeat(a, b.as_int());
    if (op == "*" && (b.is_string() || b.is_sequence()) && (a.is_int() || a.is_bool())) return repeat(b, a.as_int());
    if (!numbers) return operand_error(op, a, b);
    if (use_float || op == "/") {
      const double x = a.as_double(), y = b.as_double();
      if (op == "+") return JinjaValue::floating(x + y);
      if (op == "-") return JinjaValue::floating(x - y);
      if (op == "*") return JinjaValue::floating(x * y);
      if (op == "**") return JinjaValue::floating(std::pow(x, y));
      if (y == 0) return Status::error("ZeroDivisionError: float division by zero");
      if (op == "/") return JinjaValue::floating(x / y);
      // Python's float_floor_div / float_rem: the result takes the divisor's sign.
      double mod = std::fmod(x, y);
      double div = (x - mod) / y;
      if (mod != 0) {
        if ((y < 0) != (mod < 0)) {
          mod += y;
          div -= 1.0;
        }
      } else {
        mod = std::copysign(0.0, y);
      }
      if (op == "%") return JinjaValue::floating(mod);
      double floor_div = std::copysign(0.0, x / y);
      if (div != 0) {
        floor_div = std::floor(div);
        if (div - floor_div > 0.5) floor_div += 1.0;
      }
      return JinjaValue::floating(floor_div);
    }
    const int64_t x = a.as_int(), y = b.as_int();
    int64_t r = 0;
    const Status overflow = Status::error("OverflowError: integer arithmetic beyond 64 bits");
    if (op == "+") return __builtin_add_overflow(x, y, &r) ? Result<JinjaValue>(overflow) : JinjaValue::integer(r);
    if (op == "-") return __builtin_sub_overflow(x, y, &r) ? Result<JinjaValue>(overflow) : JinjaValue::integer(r);
    if (op == "*") return __builtin_mul_overflow(x, y, &r) ? Result<JinjaValue>(overflow) : JinjaValue::integer(r);
    if (op == "**") {
      if (y < 0) return JinjaValue::floating(std::pow(static_cast<double>(x), static_cast<double>(y)));
      if (x == 0 || x == 1) return JinjaValue::integer(y == 0 ? 1 : x);
      if (x == -1) return JinjaValue::integer(y % 2 == 0 ? 1 : -1);
      int64_t result = 1;
      for (int64_t i = 0; i < y; ++i) {  // |x| >= 2: overflows within 64 steps
        if (__builtin_mul_overflow(result, x, &result)) return overflow;
      }
      return JinjaValue::integer(result);
    }
    if (y == 0) return Status::error("ZeroDivisionError: integer division or modulo by zero");
    if (x == INT64_MIN && y == -1) return overflow;
    int64_t q = x / y, m = x % y;
    if (m != 0 && ((m < 0) != (y < 0))) {
      q -= 1;
      m += y;
    }
    if (op == "//") return JinjaValue::integer(q);
    if (op == "%") return JinjaValue::integer(m);
    return Status::errorf("unknown operator {}", op);
  }

  static Result<bool> compare(const std::string& op, const JinjaValue& a, const JinjaValue& b) {
    if (op == "==") return a == b;
    if (op == "!=") return !(a == b);
    if (op == "in" || op == "not in") {
      JinjaCallArgs args;
      args.positional.push_back(b);
      if (b.is_undefined()) return op == "not in";
      if (!b.is_string() && !b.is_sequence() && !b.is_dict()) {
        return Status::errorf("TypeError: argument of type '{}' is not iterable", b.type_name());
      }
      KVLM_ASSIGN_OR_RETURN(bool found, apply_test("in", a, args));
      return found == (op == "in");
    }
    if (a.is_undefined()) return undefined_error(a);
    if (b.is_undefined()) return undefined_error(b);
    Result<bool> r = op == "<" ? python_less(a, b) : op == ">" ? python_less(b, a) : op == "<=" ? python_less(b, a) : python_less(a, b);
    if (!r.ok()) return Status::errorf("TypeError: '{}' not supported between instances of '{}' and '{}'", op, a.type_name(), b.type_name());
    if (op == "<=" || op == ">=") return !*r;
    return *r;
  }

  std::string_view source_;
  const JinjaValue& context_;
  JinjaRenderLimits limits_;
  int64_t num_iterations_ = 0;
  int call_depth_ = 0;
};

}  // namespace

Result<std::string> render_template(const StmtList& body, std::string_view source, const JinjaValue& context,
                                    const JinjaRenderLimits& limits) {
  return Evaluator(source, context, limits).render(body);
}

}  // namespace kvlm::chat
