// ChatFormat: the model's chat template and its turn boundaries, from GGUF metadata.
#include "chat/chat_format.h"

#include <algorithm>

#include "gguf/gguf_file.h"
#include "model/tokenizer.h"

namespace kvlm::chat {

std::string_view chatml_template_source() {
  return "{%- for message in messages %}"
         "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
         "{%- endfor %}"
         "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
}

const std::vector<std::string>& known_end_of_turn_markers() {
  static const std::vector<std::string> kMarkers = {
      "<|eot_id|>",  "<|im_end|>", "<end_of_turn>", "<｜end▁of▁sentence｜>", "<|end|>",
      "<|eom_id|>",  "<|endoftext|>", "<|END_OF_TURN_TOKEN|>", "<|return|>"};
  return kMarkers;
}

Result<std::string> ChatFormat::render(const nlohmann::json& messages, bool add_generation_prompt,
                                       const nlohmann::json& extra_context) const {
  if (!messages.is_array()) return Status::error("chat messages must be a JSON array");
  if (!extra_context.is_object()) return Status::error("chat template extra context must be a JSON object");
  nlohmann::json context = extra_context;
  context["messages"] = messages;
  context["add_generation_prompt"] = add_generation_prompt;
  context["bos_token"] = bos_token;
  context["eos_token"] = eos_token;
  return chat_template.render(context);
}

namespace {

std::string token_text(const Tokenizer& tokenizer, TokenId id) {
  const auto& tokens = tokenizer.vocab().tokens;
  if (id < 0 || static_cast<size_t>(id) >= tokens.size()) return "";
  return tokens[static_cast<size_t>(id)];
}

void add_unique(std::vector<TokenId>* ids, TokenId id) {
  if (id >= 0 && std::find(ids->begin(), ids->end(), id) == ids->end()) ids->push_back(id);
}

}  // namespace

Result<ChatFormat> chat_format_for_model(const GgufFile& file, const Tokenizer& tokenizer) {
  std::string source;
  bool is_fallback = false;
  if (file.find("tokenizer.chat_template") == nullptr) {
    source = std::string(chatml_template_source());
    is_fallback = true;
  } else {
    Result<std::string> stored = file.get_string("tokenizer.chat_template");
    if (!stored.ok()) return stored.status().with_context(file.name());
    source = std::move(stored).value();
  }
  Result<ChatTemplate> parsed = ChatTemplate::parse(source);
  if (!parsed.ok()) return parsed.status().with_context(file.name() + ": tokenizer.chat_template");

  ChatFormat format{std::move(parsed).value(), source, is_fallback, token_text(tokenizer, tokenizer.bos_id()),
                    token_text(tokenizer, tokenizer.eos_id()), {}, {}};
  add_unique(&format.end_of_turn_tokens, tokenizer.eos_id());
  if (file.find("tokenizer.ggml.eot_token_id") != nullptr) {
    Result<int64_t> eot = file.get_int("tokenizer.ggml.eot_token_id");
    if (!eot.ok()) return eot.status().with_context(file.name());
    if (*eot >= 0 && *eot < tokenizer.vocab_size()) add_unique(&format.end_of_turn_tokens, static_cast<TokenId>(*eot));
  }
  for (const std::string& marker : known_end_of_turn_markers()) {
    if (source.find(marker) == std::string::npos) continue;
    if (std::optional<TokenId> id = tokenizer.find_token(marker)) {
      add_unique(&format.end_of_turn_tokens, *id);
    } else {
      format.end_of_turn_strings.push_back(marker);
    }
  }
  return format;
}

std::vector<TokenId> ChatFormat::encode(std::string_view rendered, const Tokenizer& tokenizer) const {
  const bool template_wrote_bos = !bos_token.empty() && rendered.substr(0, bos_token.size()) == bos_token;
  return tokenizer.encode(rendered, tokenizer.add_bos() && !template_wrote_bos, SpecialTokens::kParse);
}

}  // namespace kvlm::chat
