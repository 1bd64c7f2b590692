// ChatTemplate: parse = normalize newlines + lex + parse; render = evaluate over the context.
#include "chat/chat_template.h"

#include "chat/jinja_ast.h"
#include "chat/jinja_builtins.h"
#include "chat/jinja_evaluator.h"
#include "chat/jinja_lexer.h"
#include "chat/jinja_parser.h"

namespace kvlm::chat {

struct ParsedTemplate {
  std::string source;  // normalized: error positions refer to it
  StmtList body;
};

Result<ChatTemplate> ChatTemplate::parse(std::string_view source) {
  auto parsed = std::make_shared<ParsedTemplate>();
  parsed->source = normalize_template_newlines(source);
  KVLM_ASSIGN_OR_RETURN(parsed->body, parse_template(parsed->source));
  return ChatTemplate(std::move(parsed));
}

namespace {

// True when `j` nests containers deeper than `limit` levels; recurses at most limit + 1 deep.
bool nested_deeper_than(const nlohmann::json& j, int limit) {
  if (!j.is_structured()) return false;
  if (limit == 0) return true;
  for (const auto& e : j) {
    if (nested_deeper_than(e, limit - 1)) return true;
  }
  return false;
}

}  // namespace

Result<std::string> ChatTemplate::render(const nlohmann::json& context) const {
  if (!context.is_object()) return Status::error("chat template context must be a JSON object");
  // Converting it, like every walk over it, recurses once per level.
  if (nested_deeper_than(context, kMaxJinjaValueDepth)) {
    return Status::errorf("chat template context is nested deeper than {} levels", kMaxJinjaValueDepth);
  }
  const JinjaValue values = JinjaValue::from_json(context);
  return render_template(parsed_->body, parsed_->source, values);
}

}  // namespace kvlm::chat
