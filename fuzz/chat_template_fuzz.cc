// Fuzz target chat_template: a Jinja chat template and the messages it renders, from one input.
// Input: the template text, then kMessagesSeparator, then the messages: a JSON array of
// messages, a JSON object used as the whole context, or lines "role: content" (so the fuzzer
// reaches the renderer with well-formed messages even while it mutates them as text).
// Asserted: parse and render answer with a value or a Status naming the problem (never a
// crash, an exception or a hang: the renderer caps output bytes, loop iterations and macro
// depth, and range() sizes; libFuzzer's -timeout catches any loop those caps miss).
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "core/check.h"
#include "fuzz/fuzz_input.h"
#include "fuzz/fuzz_targets.h"

namespace kvlm::fuzz {
namespace {

constexpr std::string_view kMessagesSeparator = "\n<<<messages>>>\n";

nlohmann::json messages_from_lines(std::string_view text) {
  nlohmann::json messages = nlohmann::json::array();
  while (!text.empty()) {
    const auto [line, rest] = split_at(text, "\n");
    text = rest;
    const auto [role, content] = split_at(line, ": ");
    // Raw bytes, possibly invalid UTF-8: `kvlm chat` puts the terminal's lines in messages as read.
    messages.push_back({{"role", std::string(role)}, {"content", std::string(content)}});
  }
  return messages;
}

nlohmann::json context_from(std::string_view messages_text) {
  nlohmann::json parsed = nlohmann::json::parse(messages_text, nullptr, /*allow_exceptions=*/false);
  nlohmann::json context = nlohmann::json::object();
  if (parsed.is_object()) {
    context = std::move(parsed);
  } else if (parsed.is_array()) {
    context["messages"] = std::move(parsed);
  } else {
    context["messages"] = messages_from_lines(messages_text);
  }
  // What ChatFormat passes beside the messages.
  if (!context.contains("bos_token")) context["bos_token"] = "<s>";
  if (!context.contains("eos_token")) context["eos_token"] = "</s>";
  if (!context.contains("add_generation_prompt")) context["add_generation_prompt"] = messages_text.size() % 2 == 0;
  return context;
}

}  // namespace

int chat_template_one_input(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const auto [template_text, messages_text] = split_at(input, kMessagesSeparator);
  auto parsed = chat::ChatTemplate::parse(template_text);
  if (!parsed.ok()) {
    KVLM_CHECK(!parsed.status().message().empty(), "a parse error without a message");
    return 0;
  }
  auto rendered = parsed->render(context_from(messages_text));
  if (!rendered.ok()) KVLM_CHECK(!rendered.status().message().empty(), "a render error without a message");
  return 0;
}

}  // namespace kvlm::fuzz

KVLM_LIBFUZZER_ENTRY(kvlm::fuzz::chat_template_one_input)
