// ChatFormat: how one model turns messages into a prompt and where its turns end: its chat
// template (or the documented chatml fallback), BOS/EOS text and end-of-turn tokens.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "core/ids.h"
#include "core/status.h"

namespace kvlm {
class GgufFile;
class Tokenizer;
}  // namespace kvlm

namespace kvlm::chat {

struct ChatFormat {
  ChatTemplate chat_template;
  std::string template_source;
  bool is_fallback = false;          // the file has no tokenizer.chat_template: chatml is used
  std::string bos_token, eos_token;  // the text of the model's BOS / EOS tokens ("" if none)
  // Generation stops here: EOS, tokenizer.ggml.eot_token_id when present, and each end-of-turn
  // marker the template writes (<|eot_id|>, <|im_end|>, <end_of_turn>, ...) that is one token.
  std::vector<TokenId> end_of_turn_tokens;
  // End-of-turn markers the template writes that are NOT one token of the vocabulary
  // (chatml's <|im_end|> on a vocabulary without it): stop strings instead.
  std::vector<std::string> end_of_turn_strings;

  // Renders messages (a JSON array of {role, content, ...}) with the model's bos/eos.
  // extra_context's keys (tools, enable_thinking, ...) are visible to the template; messages,
  // add_generation_prompt, bos_token and eos_token always come from the arguments and the model.
  Result<std::string> render(const nlohmann::json& messages, bool add_generation_prompt,
                             const nlohmann::json& extra_context = nlohmann::json::object()) const;
  // The rendered prompt as tokens: its special tokens parsed as special tokens, and a BOS added
  // only when the vocabulary wants one and the template did not already write it (a second BOS
  // would change the model's input).
  std::vector<TokenId> encode(std::string_view rendered, const Tokenizer& tokenizer) const;
};

// Reads tokenizer.chat_template from the file (absent -> chatml with is_fallback=true; a
// template that fails to parse -> an error naming the problem).
Result<ChatFormat> chat_format_for_model(const GgufFile& file, const Tokenizer& tokenizer);

// The chatml template used as the fallback (public so the README and tests can name it).
std::string_view chatml_template_source();

// The end-of-turn markers recognized in template sources, in the order they are checked.
const std::vector<std::string>& known_end_of_turn_markers();

}  // namespace kvlm::chat
