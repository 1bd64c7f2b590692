#include "chat/jinja_ast.h"

namespace kvlm::chat {

bool mentions_name(const Expr& expr, const std::string& name) {
  if (expr.kind == ExprKind::kName && expr.name == name) return true;
  for (const ExprPtr& operand : expr.operands) {
    if (operand && mentions_name(*operand, name)) return true;
  }
  return false;
}

namespace {

bool any_mentions(const std::vector<ExprPtr>& exprs, const std::string& name) {
  for (const ExprPtr& e : exprs) {
    if (e && mentions_name(*e, name)) return true;
  }
  return false;
}

bool statement_mentions(const Stmt& s, const std::string& name) {
  if (s.expr && mentions_name(*s.expr, name)) return true;
  if (s.filter && mentions_name(*s.filter, name)) return true;
  if (any_mentions(s.conditions, name) || any_mentions(s.values, name)) return true;
  for (const StmtList& body : s.bodies) {
    if (mentions_name(body, name)) return true;
  }
  return mentions_name(s.body, name) || mentions_name(s.else_body, name);
}

}  // namespace

bool mentions_name(const StmtList& statements, const std::string& name) {
  for (const StmtPtr& s : statements) {
    if (s && statement_mentions(*s, name)) return true;
  }
  return false;
}

}  // namespace kvlm::chat
