// ChatTemplate: a model's Jinja chat template, parsed once and rendered as Hugging Face does
// (jinja2's ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loopcontrols,
// HF's tojson, raise_exception and strftime_now).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace kvlm::chat {

struct ParsedTemplate;  // the source and its statement tree (chat_template.cc)

class ChatTemplate {
 public:
  // Parses once; a syntax error or an unsupported construct is a Status naming line:column
  // and the construct.
  static Result<ChatTemplate> parse(std::string_view source);

  // context: a JSON object (messages, add_generation_prompt, bos_token, eos_token, ...).
  // Errors (raise_exception -> "chat template raised an exception: <msg>", undefined access
  // where jinja2 raises, type errors, output over 16 MiB, loop/recursion caps) are Statuses.
  // Objects keep nlohmann::json's key order (sorted), which tojson and dict printing show.
  Result<std::string> render(const nlohmann::json& context) const;

 private:
  explicit ChatTemplate(std::shared_ptr<const ParsedTemplate> parsed) : parsed_(std::move(parsed)) {}
  std::shared_ptr<const ParsedTemplate> parsed_;  // immutable: copies share it across threads
};

}  // namespace kvlm::chat
