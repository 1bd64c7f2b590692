// JinjaParser: recursive descent over the lexer's tokens, one function per jinja2 grammar rule.
#include "chat/jinja_parser.h"

#include <cerrno>
#include <cstdlib>
#include <initializer_list>

#include <fmt/format.h>

#include "chat/jinja_lexer.h"

namespace kvlm::chat {
namespace {

using TK = JinjaTokenKind;

class Parser {
 public:
  Parser(std::string_view src, std::vector<JinjaToken> tokens) : src_(src), tokens_(std::move(tokens)) {}

  Result<StmtList> parse() {
    StmtList body;
    std::string end_tag;
    KVLM_RETURN_IF_ERROR(parse_body({}, &body, &end_tag));
    return body;
  }

 private:
  const JinjaToken& cur() const { return tokens_[pos_]; }
  const JinjaToken& peek(size_t ahead = 1) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  void advance() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool is_op(std::string_view op) const { return cur().kind == TK::kOperator && cur().text == op; }
  bool is_name(std::string_view name) const { return cur().kind == TK::kName && cur().text == name; }

  Status error_at(size_t offset, std::string_view what) const {
    return Status::errorf("template syntax error at {}: {}", describe_position(src_, offset), what);
  }
  Status unexpected(std::string_view expected) const {
    std::string got;
    switch (cur().kind) {
      case TK::kEnd: got = "end of template"; break;
      case TK::kBlockEnd: got = "'%}'"; break;
      case TK::kVariableEnd: got = "'}}'"; break;
      case TK::kData: got = "template text"; break;
      case TK::kString: got = "a string"; break;
      default: got = fmt::format("'{}'", cur().text);
    }
    return error_at(cur().offset, fmt::format("expected {}, got {}", expected, got));
  }
  Status expect_op(std::string_view op) {
    if (!is_op(op)) return unexpected(fmt::format("'{}'", op));
    advance();
    return Status();
  }
  Result<std::string> expect_name() {
    if (cur().kind != TK::kName) return unexpected("a name");
    std::string name = cur().text;
    advance();
    return name;
  }
  Status expect_block_end() {
    if (cur().kind != TK::kBlockEnd) return unexpected("'%}'");
    advance();
    return Status();
  }

  // Guards recursion: every nested rule holds one.
  struct DepthGuard {
    explicit DepthGuard(int* depth) : depth_(depth) { ++*depth_; }
    ~DepthGuard() { --*depth_; }
    int* depth_;
  };
  Status check_depth() const {
    if (depth_ > kMaxParseDepth) {
      return error_at(cur().offset, fmt::format("nesting deeper than {} levels", kMaxParseDepth));
    }
    return Status();
  }

  ExprPtr make(ExprKind kind, size_t offset) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->offset = offset;
    return e;
  }

  // ---- statements ----

  // Parses statements until a block tag whose name is in `end_names` (left unconsumed, its name
  // in *end_tag) or the end of the template (allowed only when end_names is empty).
  Status parse_body(std::initializer_list<std::string_view> end_names, StmtList* body, std::string* end_tag) {
    DepthGuard guard(&depth_);
    KVLM_RETURN_IF_ERROR(check_depth());
    const size_t start_offset = cur().offset;
    while (true) {
      const JinjaToken& t = cur();
      if (t.kind == TK::kEnd) {
        if (end_names.size() == 0) return Status();
        std::string names;
        for (auto n : end_names) names += (names.empty() ? "'" : " or '") + std::string(n) + "'";
        return error_at(start_offset, fmt::format("unexpected end of template: missing {}", names));
      }
      if (t.kind == TK::kData) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kData;
        s->offset = t.offset;
        s->text = t.text;
        body->push_back(std::move(s));
        advance();
      } else if (t.kind == TK::kVariableBegin) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kOutput;
        s->offset = t.offset;
        advance();
        KVLM_ASSIGN_OR_RETURN(s->expr, parse_tuple(true));
        if (cur().kind != TK::kVariableEnd) return unexpected("'}}'");
        advance();
        body->push_back(std::move(s));
      } else if (t.kind == TK::kBlockBegin) {
        const JinjaToken& name = peek();
        if (name.kind != TK::kName) {
          advance();
          return unexpected("a tag name");
        }
        for (auto n : end_names) {
          if (name.text == n) {
            advance();
            *end_tag = name.text;
            advance();  // now after the tag name
            return Status();
          }
        }
        advance();
        KVLM_ASSIGN_OR_RETURN(StmtPtr s, parse_statement());
        body->push_back(std::move(s));
      } else {
        return unexpected("template text or a tag");
      }
    }
  }

  Result<StmtPtr> parse_statement() {
    const JinjaToken tag = cur();
    auto s = std::make_unique<Stmt>();
    s->offset = tag.offset;
    advance();
    const std::string& n = tag.text;
    if (n == "if") return parse_if(std::move(s));
    if (n == "for") return parse_for(std::move(s));
    if (n == "set") return parse_set(std::move(s));
    if (n == "macro") return parse_macro(std::move(s));
    if (n == "with") return parse_with(std::move(s));
    if (n == "filter") return parse_filter_block(std::move(s));
    if (n == "break" || n == "continue") {
      if (loop_depth_ == 0) return error_at(tag.offset, fmt::format("'{}' outside of a loop", n));
      s->kind = n == "break" ? StmtKind::kBreak : StmtKind::kContinue;
      KVLM_RETURN_IF_ERROR(expect_block_end());
      return s;
    }
    static const char* const kRefused[] = {"extends", "block", "include", "import", "from", "call", "do",
                                           "autoescape", "generation", "trans"};
    for (const char* r : kRefused) {
      if (n == r) return error_at(tag.offset, fmt::format("unsupported construct '{{% {} %}}'", n));
    }
    return error_at(tag.offset, fmt::format("unknown tag '{}'", n));
  }

  Result<StmtPtr> parse_if(StmtPtr s) {
    s->kind = StmtKind::kIf;
    while (true) {
      KVLM_ASSIGN_OR_RETURN(ExprPtr cond, parse_tuple(false));
      KVLM_RETURN_IF_ERROR(expect_block_end());
      StmtList body;
      std::string end;
      KVLM_RETURN_IF_ERROR(parse_body({"elif", "else", "endif"}, &body, &end));
      s->conditions.push_back(std::move(cond));
      s->bodies.push_back(std::move(body));
      if (end == "elif") continue;
      if (end == "else") {
        KVLM_RETURN_IF_ERROR(expect_block_end());
        KVLM_RETURN_IF_ERROR(parse_body({"endif"}, &s->else_body, &end));
      }
      KVLM_RETURN_IF_ERROR(expect_block_end());
      return s;
    }
  }

  // "name" or "a, b" or "(a, b)" (jinja2's assign target without namespaces).
  Status parse_name_targets(Stmt* s) {
    const bool paren = is_op("(");
    if (paren) advance();
    KVLM_ASSIGN_OR_RETURN(std::string first, expect_name());
    s->targets.push_back(first);
    while (is_op(",")) {
      s->targets_are_tuple = true;
      advance();
      if (cur().kind != TK::kName) break;  // trailing comma
      KVLM_ASSIGN_OR_RETURN(std::string more, expect_name());
      s->targets.push_back(more);
    }
    if (paren) {
      s->targets_are_tuple = true;
      KVLM_RETURN_IF_ERROR(expect_op(")"));
    }
    return Status();
  }

  Result<StmtPtr> parse_for(StmtPtr s) {
    s->kind = StmtKind::kFor;
    KVLM_RETURN_IF_ERROR(parse_name_targets(s.get()));
    if (!is_name("in")) return unexpected("'in'");
    advance();
    KVLM_ASSIGN_OR_RETURN(s->expr, parse_tuple(false, /*stop_at_if=*/true));
    if (is_name("if")) {
      advance();
      KVLM_ASSIGN_OR_RETURN(s->filter, parse_expression());
    }
    if (is_name("recursive")) return error_at(cur().offset, "unsupported construct: recursive for loops");
    KVLM_RETURN_IF_ERROR(expect_block_end());
    std::string end;
    ++loop_depth_;
    Status body_status = parse_body({"else", "endfor"}, &s->body, &end);
    --loop_depth_;
    KVLM_RETURN_IF_ERROR(body_status);
    if (end == "else") {
      KVLM_RETURN_IF_ERROR(expect_block_end());
      // The else body runs outside the loop: break/continue there are not inside it.
      const int saved = loop_depth_;
      loop_depth_ = 0;
      Status else_status = parse_body({"endfor"}, &s->else_body, &end);
      loop_depth_ = saved;
      KVLM_RETURN_IF_ERROR(else_status);
    }
    KVLM_RETURN_IF_ERROR(expect_block_end());
    s->reads_loop_variable = mentions_name(s->body, "loop") || (s->filter && mentions_name(*s->filter, "loop"));
    return s;
  }

  Result<StmtPtr> parse_set(StmtPtr s) {
    if (cur().kind == TK::kName && peek().kind == TK::kOperator && peek().text == "." &&
        peek(2).kind == TK::kName) {
      s->name = cur().text;
      s->attribute = peek(2).text;
      advance();
      advance();
      advance();
    } else {
      KVLM_RETURN_IF_ERROR(parse_name_targets(s.get()));
    }
    if (is_op("=")) {
      advance();
      s->kind = StmtKind::kSet;
      KVLM_ASSIGN_OR_RETURN(s->expr, parse_tuple(true));
      KVLM_RETURN_IF_ERROR(expect_block_end());
      return s;
    }
    if (!s->attribute.empty() || s->targets_are_tuple) return unexpected("'='");
    s->kind = StmtKind::kSetBlock;
    KVLM_RETURN_IF_ERROR(expect_block_end());
    std::string end;
    KVLM_RETURN_IF_ERROR(parse_body({"endset"}, &s->body, &end));
    KVLM_RETURN_IF_ERROR(expect_block_end());
    return s;
  }

  Result<StmtPtr> parse_macro(StmtPtr s) {
    s->kind = StmtKind::kMacro;
    KVLM_ASSIGN_OR_RETURN(s->name, expect_name());
    KVLM_RETURN_IF_ERROR(expect_op("("));
    while (!is_op(")")) {
      if (!s->targets.empty()) KVLM_RETURN_IF_ERROR(expect_op(","));
      if (is_op(")")) break;
      KVLM_ASSIGN_OR_RETURN(std::string param, expect_name());
      ExprPtr default_value;
      if (is_op("=")) {
        advance();
        KVLM_ASSIGN_OR_RETURN(default_value, parse_expression());
      } else if (!s->values.empty() && s->values.back()) {
        return error_at(cur().offset, "non-default macro argument follows a default argument");
      }
      s->targets.push_back(param);
      s->values.push_back(std::move(default_value));
    }
    advance();
    KVLM_RETURN_IF_ERROR(expect_block_end());
    std::string end;
    const int saved = loop_depth_;
    loop_depth_ = 0;
    Status body_status = parse_body({"endmacro"}, &s->body, &end);
    loop_depth_ = saved;
    KVLM_RETURN_IF_ERROR(body_status);
    if (cur().kind == TK::kName && cur().text == s->name) advance();  // "{% endmacro name %}"
    KVLM_RETURN_IF_ERROR(expect_block_end());
    return s;
  }

  Result<StmtPtr> parse_with(StmtPtr s) {
    s->kind = StmtKind::kWith;
    while (cur().kind != TK::kBlockEnd) {
      if (!s->targets.empty()) KVLM_RETURN_IF_ERROR(expect_op(","));
      KVLM_ASSIGN_OR_RETURN(std::string target, expect_name());
      KVLM_RETURN_IF_ERROR(expect_op("="));
      KVLM_ASSIGN_OR_RETURN(ExprPtr value, parse_expression());
      s->targets.push_back(target);
      s->values.push_back(std::move(value));
    }
    advance();
    std::string end;
    KVLM_RETURN_IF_ERROR(parse_body({"endwith"}, &s->body, &end));
    KVLM_RETURN_IF_ERROR(expect_block_end());
    return s;
  }

  Result<StmtPtr> parse_filter_block(StmtPtr s) {
    s->kind = StmtKind::kFilterBlock;
    ExprPtr input = make(ExprKind::kName, cur().offset);  // name "": the block's rendered body
    KVLM_ASSIGN_OR_RETURN(s->expr, parse_filter_call(std::move(input)));
    while (is_op("|")) {
      advance();
      KVLM_ASSIGN_OR_RETURN(s->expr, parse_filter_call(std::move(s->expr)));
    }
    KVLM_RETURN_IF_ERROR(expect_block_end());
    std::string end;
    KVLM_RETURN_IF_ERROR(parse_body({"endfilter"}, &s->body, &end));
    KVLM_RETURN_IF_ERROR(expect_block_end());
    return s;
  }

  // ---- expressions, lowest precedence first ----

  bool at_tuple_end() const {
    if (cur().kind == TK::kVariableEnd || cur().kind == TK::kBlockEnd || cur().kind == TK::kEnd) return true;
    if (cur().kind == TK::kOperator && (cur().text == ")" || cur().text == "]" || cur().text == "}")) return true;
    return false;
  }

  // A comma-separated list becomes a tuple; one item without a comma stays itself.
  // with_condexpr=false is jinja2's form for `for` iterables and `if` tests (no inline if/else).
  Result<ExprPtr> parse_tuple(bool with_condexpr, bool stop_at_if = false) {
    const size_t offset = cur().offset;
    std::vector<ExprPtr> items;
    bool saw_comma = false;
    while (true) {
      if (!items.empty()) {
        if (!is_op(",")) break;
        advance();
        saw_comma = true;
        if (at_tuple_end() || (stop_at_if && is_name("if"))) break;
      }
      Result<ExprPtr> item = with_condexpr ? parse_expression() : parse_or();
      if (!item.ok()) return item.status();
      items.push_back(std::move(item).value());
    }
    if (!saw_comma) return std::move(items[0]);
    ExprPtr tuple = make(ExprKind::kTuple, offset);
    tuple->operands = std::move(items);
    return tuple;
  }

  Result<ExprPtr> parse_expression() {
    DepthGuard guard(&depth_);
    KVLM_RETURN_IF_ERROR(check_depth());
    KVLM_ASSIGN_OR_RETURN(ExprPtr expr, parse_or());
    while (is_name("if")) {
      const size_t offset = cur().offset;
      advance();
      KVLM_ASSIGN_OR_RETURN(ExprPtr cond, parse_or());
      ExprPtr otherwise;
      if (is_name("else")) {
        advance();
        KVLM_ASSIGN_OR_RETURN(otherwise, parse_expression());
      }
      ExprPtr node = make(ExprKind::kConditional, offset);
      node->operands.push_back(std::move(expr));
      node->operands.push_back(std::move(cond));
      node->operands.push_back(std::move(otherwise));
      expr = std::move(node);
    }
    return expr;
  }

  Result<ExprPtr> parse_or() {
    KVLM_ASSIGN_OR_RETURN(ExprPtr left, parse_and());
    while (is_name("or")) {
      const size_t offset = cur().offset;
      advance();
      KVLM_ASSIGN_OR_RETURN(ExprPtr right, parse_and());
      ExprPtr node = make(ExprKind::kOr, offset);
      node->operands.push_back(std::move(left));
      node->operands.push_back(std::move(right));
      left = std::move(node);
    }
    return left;
  }

  Result<ExprPtr> parse_and() {
    KVLM_ASSIGN_OR_RETURN(ExprPtr left, parse_not());
    while (is_name("and")) {
      const size_t offset = cur().offset;
      advance();
      KVLM_ASSIGN_OR_RETURN(ExprPtr right, parse_not());
      ExprPtr node = make(ExprKind::kAnd, offset);
      node->operands.push_back(std::move(left));
      node->operands.push_back(std::move(right));
      left = std::move(node);
    }
    return left;
  }

  Result<ExprPtr> parse_not() {
    if (is_name("not")) {
      DepthGuard guard(&depth_);
      KVLM_RETURN_IF_ERROR(check_depth());
      const size_t offset = cur().offset;
      advance();
      KVLM_ASSIGN_OR_RETURN(ExprPtr inner, parse_not());
      ExprPtr node = make(ExprKind::kNot, offset);
      node->operands.push_back(std::move(inner));
      return node;
    }
    return parse_compare();
  }

  Result<ExprPtr> parse_compare() {
    const size_t offset = cur().offset;
    KVLM_ASSIGN_OR_RETURN(ExprPtr first, parse_math1());
    ExprPtr node;
    while (true) {
      std::string op;
      if (cur().kind == TK::kOperator && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                          cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        op = cur().text;
        advance();
      } else if (is_name("in")) {
        op = "in";
        advance();
      } else if (is_name("not") && peek().kind == TK::kName && peek().text == "in") {
        op = "not in";
        advance();
        advance();
      } else {
        break;
      }
      if (!node) {
        node = make(ExprKind::kCompare, offset);
        node->operands.push_back(std::move(first));
      }
      KVLM_ASSIGN_OR_RETURN(ExprPtr right, parse_math1());
      node->operands.push_back(std::move(right));
      node->compare_ops.push_back(op);
    }
    return node ? std::move(node) : std::move(first);
  }

  using Rule = Result<ExprPtr> (Parser::*)();
  Result<ExprPtr> parse_binary_level(Rule next, std::initializer_list<std::string_view> ops) {
    KVLM_ASSIGN_OR_RETURN(ExprPtr left, (this->*next)());
    while (cur().kind == TK::kOperator) {
      bool match = false;
      for (auto op : ops) match = match || cur().text == op;
      if (!match) break;
      ExprPtr node = make(ExprKind::kBinary, cur().offset);
      node->name = cur().text;
      advance();
      KVLM_ASSIGN_OR_RETURN(ExprPtr right, (this->*next)());
      node->operands.push_back(std::move(left));
      node->operands.push_back(std::move(right));
      left = std::move(node);
    }
    return left;
  }
  Result<ExprPtr> parse_math1() { return parse_binary_level(&Parser::parse_concat, {"+", "-"}); }
  Result<ExprPtr> parse_concat() { return parse_binary_level(&Parser::parse_math2, {"~"}); }
  Result<ExprPtr> parse_math2() { return parse_binary_level(&Parser::parse_pow, {"*", "/", "//", "%"}); }
  Result<ExprPtr> parse_pow() { return parse_binary_level(&Parser::parse_unary_filtered, {"**"}); }
  Result<ExprPtr> parse_unary_filtered() { return parse_unary(true); }

  Result<ExprPtr> parse_unary(bool with_filter) {
    DepthGuard guard(&depth_);
    KVLM_RETURN_IF_ERROR(check_depth());
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      node = make(is_op("-") ? ExprKind::kNegate : ExprKind::kPlus, cur().offset);
      advance();
      KVLM_ASSIGN_OR_RETURN(ExprPtr inner, parse_unary(false));
      node->operands.push_back(std::move(inner));
    } else {
      KVLM_ASSIGN_OR_RETURN(node, parse_primary());
    }
    KVLM_ASSIGN_OR_RETURN(node, parse_postfix(std::move(node)));
    if (with_filter) {
      KVLM_ASSIGN_OR_RETURN(node, parse_filter_expr(std::move(node)));
    }
    return node;
  }

  Result<ExprPtr> parse_primary() {
    const JinjaToken& t = cur();
    const size_t offset = t.offset;
    if (t.kind == TK::kName) {
      const std::string& n = t.text;
      ExprPtr node = make(ExprKind::kConstant, offset);
      if (n == "true" || n == "True") {
        node->value = JinjaValue::boolean(true);
      } else if (n == "false" || n == "False") {
        node->value = JinjaValue::boolean(false);
      } else if (n == "none" || n == "None") {
        node->value = JinjaValue::none();
      } else {
        node->kind = ExprKind::kName;
        node->name = n;
      }
      advance();
      return node;
    }
    if (t.kind == TK::kString) {
      std::string text;
      while (cur().kind == TK::kString) {  // adjacent literals concatenate, as in Python
        text += cur().text;
        advance();
      }
      ExprPtr node = make(ExprKind::kConstant, offset);
      node->value = JinjaValue::string(std::move(text));
      return node;
    }
    if (t.kind == TK::kInteger || t.kind == TK::kFloat) {
      ExprPtr node = make(ExprKind::kConstant, offset);
      errno = 0;
      if (t.kind == TK::kInteger) {
        const long long v = std::strtoll(t.text.c_str(), nullptr, 10);
        if (errno == ERANGE) return error_at(offset, "unsupported construct: integer literal beyond 64 bits");
        node->value = JinjaValue::integer(v);
      } else {
        node->value = JinjaValue::floating(std::strtod(t.text.c_str(), nullptr));
      }
      advance();
      return node;
    }
    if (is_op("(")) {
      advance();
      if (is_op(")")) {
        advance();
        return make(ExprKind::kTuple, offset);
      }
      KVLM_ASSIGN_OR_RETURN(ExprPtr inner, parse_tuple(true));
      KVLM_RETURN_IF_ERROR(expect_op(")"));
      return inner;
    }
    if (is_op("[")) {
      advance();
      ExprPtr node = make(ExprKind::kList, offset);
      while (!is_op("]")) {
        if (!node->operands.empty()) {
          KVLM_RETURN_IF_ERROR(expect_op(","));
          if (is_op("]")) break;
        }
        KVLM_ASSIGN_OR_RETURN(ExprPtr item, parse_expression());
        node->operands.push_back(std::move(item));
      }
      advance();
      return node;
    }
    if (is_op("{")) {
      advance();
      ExprPtr node = make(ExprKind::kDict, offset);
      while (!is_op("}")) {
        if (!node->operands.empty()) {
          KVLM_RETURN_IF_ERROR(expect_op(","));
          if (is_op("}")) break;
        }
        KVLM_ASSIGN_OR_RETURN(ExprPtr key, parse_expression());
        KVLM_RETURN_IF_ERROR(expect_op(":"));
        KVLM_ASSIGN_OR_RETURN(ExprPtr value, parse_expression());
        node->operands.push_back(std::move(key));
        node->operands.push_back(std::move(value));
      }
      advance();
      return node;
    }
    return unexpected("an expression");
  }

  Result<ExprPtr> parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".")) {
        const size_t offset = cur().offset;
        advance();
        if (cur().kind == TK::kName) {
          ExprPtr attr = make(ExprKind::kGetAttr, offset);
          attr->name = cur().text;
          attr->operands.push_back(std::move(node));
          node = std::move(attr);
        } else if (cur().kind == TK::kInteger) {
          ExprPtr item = make(ExprKind::kGetItem, offset);
          ExprPtr index = make(ExprKind::kConstant, cur().offset);
          index->value = JinjaValue::integer(std::strtoll(cur().text.c_str(), nullptr, 10));
          item->operands.push_back(std::move(node));
          item->operands.push_back(std::move(index));
          node = std::move(item);
        } else {
          return unexpected("an attribute name");
        }
        advance();
      } else if (is_op("[")) {
        KVLM_ASSIGN_OR_RETURN(node, parse_subscript(std::move(node)));
      } else if (is_op("(")) {
        KVLM_ASSIGN_OR_RETURN(node, parse_call(std::move(node)));
      } else {
        return node;
      }
    }
  }

  Result<ExprPtr> parse_subscript(ExprPtr node) {
    const size_t offset = cur().offset;
    advance();  // [
    ExprPtr parts[3];
    int num_colons = 0;
    bool has_index = false;
    while (!is_op("]")) {
      if (is_op(":")) {
        if (++num_colons > 2) return unexpected("']'");
        advance();
        continue;
      }
      if (is_op(",")) return error_at(cur().offset, "unsupported construct: tuple subscripts");
      if (parts[num_colons]) return unexpected("':' or ']'");
      KVLM_ASSIGN_OR_RETURN(parts[num_colons], parse_expression());
      has_index = true;
    }
    advance();
    if (num_colons == 0) {
      if (!has_index) return error_at(offset, "empty subscript");
      ExprPtr item = make(ExprKind::kGetItem, offset);
      item->operands.push_back(std::move(node));
      item->operands.push_back(std::move(parts[0]));
      return item;
    }
    ExprPtr slice = make(ExprKind::kSlice, offset);
    slice->operands.push_back(std::move(node));
    for (auto& p : parts) slice->operands.push_back(std::move(p));
    return slice;
  }

  // (args): positional then keyword arguments, appended to `call`'s operands.
  Status parse_call_args(Expr* call) {
    advance();  // (
    bool first = true;
    while (!is_op(")")) {
      if (!first) {
        KVLM_RETURN_IF_ERROR(expect_op(","));
        if (is_op(")")) break;
      }
      first = false;
      if (is_op("*") || is_op("**")) return error_at(cur().offset, "unsupported construct: *args / **kwargs in calls");
      if (cur().kind == TK::kName && peek().kind == TK::kOperator && peek().text == "=") {
        call->keyword_names.push_back(cur().text);
        advance();
        advance();
        KVLM_ASSIGN_OR_RETURN(ExprPtr value, parse_expression());
        call->operands.push_back(std::move(value));
      } else {
        if (!call->keyword_names.empty()) return error_at(cur().offset, "positional argument follows keyword argument");
        KVLM_ASSIGN_OR_RETURN(ExprPtr value, parse_expression());
        call->operands.push_back(std::move(value));
      }
    }
    advance();
    return Status();
  }

  Result<ExprPtr> parse_call(ExprPtr callee) {
    ExprPtr call = make(ExprKind::kCall, cur().offset);
    call->operands.push_back(std::move(callee));
    KVLM_RETURN_IF_ERROR(parse_call_args(call.get()));
    return call;
  }

  Result<std::string> parse_dotted_name() {
    KVLM_ASSIGN_OR_RETURN(std::string name, expect_name());
    while (is_op(".")) {
      advance();
      KVLM_ASSIGN_OR_RETURN(std::string part, expect_name());
      name += "." + part;
    }
    return name;
  }

  // name[(args)] applied to `input` (after the '|').
  Result<ExprPtr> parse_filter_call(ExprPtr input) {
    ExprPtr node = make(ExprKind::kFilter, cur().offset);
    KVLM_ASSIGN_OR_RETURN(node->name, parse_dotted_name());
    node->operands.push_back(std::move(input));
    if (is_op("(")) KVLM_RETURN_IF_ERROR(parse_call_args(node.get()));
    return node;
  }

  Result<ExprPtr> parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        advance();
        KVLM_ASSIGN_OR_RETURN(node, parse_filter_call(std::move(node)));
      } else if (is_name("is")) {
        ExprPtr test = make(ExprKind::kTest, cur().offset);
        advance();
        if (is_name("not")) {
          test->negated = true;
          advance();
        }
        KVLM_ASSIGN_OR_RETURN(test->name, parse_dotted_name());
        test->operands.push_back(std::move(node));
        if (is_op("(")) {
          KVLM_RETURN_IF_ERROR(parse_call_args(test.get()));
        } else if ((cur().kind == TK::kName || cur().kind == TK::kString || cur().kind == TK::kInteger ||
                    cur().kind == TK::kFloat || is_op("(") || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) return error_at(cur().offset, "you cannot chain multiple tests with 'is'");
          // One argument without parentheses: "x is divisibleby 3", "x is sameas none".
          KVLM_ASSIGN_OR_RETURN(ExprPtr arg, parse_primary());
          KVLM_ASSIGN_OR_RETURN(arg, parse_postfix(std::move(arg)));
          test->operands.push_back(std::move(arg));
        }
        node = std::move(test);
      } else if (is_op("(")) {
        KVLM_ASSIGN_OR_RETURN(node, parse_call(std::move(node)));
      } else {
        return node;
      }
    }
  }

  std::string_view src_;
  std::vector<JinjaToken> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Result<StmtList> parse_template(std::string_view normalized_source) {
  KVLM_ASSIGN_OR_RETURN(std::vector<JinjaToken> tokens, lex_template(normalized_source));
  return Parser(normalized_source, std::move(tokens)).parse();
}

}  // namespace kvlm::chat
