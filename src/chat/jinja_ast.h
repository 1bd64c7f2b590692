// The parsed form of a Jinja template: expression and statement nodes, immutable after parsing.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "chat/jinja_value.h"

namespace kvlm::chat {

enum class ExprKind {
  kConstant,     // value
  kName,         // name
  kList,         // operands: items
  kTuple,        // operands: items
  kDict,         // operands: key0, value0, key1, value1, ...
  kGetAttr,      // operands[0].name (jinja2: attribute first, then item)
  kGetItem,      // operands[0][operands[1]] (item first, then attribute)
  kSlice,        // operands[0][operands[1]:operands[2]:operands[3]], absent parts null
  kCall,         // operands[0](args...)
  kFilter,       // operands[0] | name(args...)
  kTest,         // operands[0] is [not] name(args...)
  kNot,          // not operands[0]
  kNegate,       // -operands[0]
  kPlus,         // +operands[0]
  kBinary,       // operands[0] <name> operands[1]: + - * / // % ** ~
  kCompare,      // operands[0] compare_ops[0] operands[1] compare_ops[1] operands[2] ...
  kAnd,
  kOr,
  kConditional,  // operands[0] if operands[1] else operands[2] (null: undefined)
};

struct Expr {
  ExprKind kind = ExprKind::kConstant;
  size_t offset = 0;  // where it starts in the normalized source
  std::string name;
  JinjaValue value;
  std::vector<std::unique_ptr<Expr>> operands;
  // Calls, filters and tests: operands after the callee / input are the positional arguments,
  // then one per keyword_names entry, in order.
  std::vector<std::string> keyword_names;
  std::vector<std::string> compare_ops;  // "==", "!=", "<", "<=", ">", ">=", "in", "not in"
  bool negated = false;                  // kTest: "is not"
};
using ExprPtr = std::unique_ptr<Expr>;

enum class StmtKind {
  kData,      // text
  kOutput,    // {{ expr }}
  kIf,        // conditions[i] -> bodies[i]; else_body
  kFor,       // for targets in expr [if filter]: body; else_body
  kSet,       // targets = expr, or namespace_name.attribute = expr
  kSetBlock,  // {% set target %}body{% endset %}
  kMacro,     // name(params = defaults): body
  kWith,      // {% with targets[i] = values[i] %}body{% endwith %}
  kFilterBlock,  // {% filter f %}body{% endfilter %}: expr is the filter chain over kName "" input
  kBreak,
  kContinue,
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using StmtList = std::vector<StmtPtr>;

struct Stmt {
  StmtKind kind = StmtKind::kData;
  size_t offset = 0;
  std::string text;                   // kData
  ExprPtr expr;                       // output, set value, for iterable, filter chain
  ExprPtr filter;                     // for ... if filter
  std::vector<ExprPtr> conditions;    // kIf
  std::vector<StmtList> bodies;       // kIf: one per condition
  StmtList body;                      // for, set block, macro, with, filter block
  StmtList else_body;                 // if, for
  std::vector<std::string> targets;   // for / set / with names; macro parameter names
  std::vector<ExprPtr> values;        // with values; macro defaults (null: none)
  bool targets_are_tuple = false;     // "for k, v in ..." / "set a, b = ..."
  std::string name;                   // macro name; namespace name of "set ns.attr"
  std::string attribute;              // "set ns.attr"
  // kFor: whether the body or filter may read the `loop` variable; when not, the evaluator
  // skips building it (a dict of twelve entries per iteration, most of a bare loop's cost).
  bool reads_loop_variable = true;
};

// Whether any expression in the statements (nested ones included) is the name `name`.
// Conservative: a mention shadowed by an inner binding still counts.
bool mentions_name(const StmtList& statements, const std::string& name);
bool mentions_name(const Expr& expr, const std::string& name);

}  // namespace kvlm::chat
