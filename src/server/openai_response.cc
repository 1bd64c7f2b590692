#include "server/openai_response.h"

#include "model/incremental_detokenizer.h"

namespace kvlm::server {

using nlohmann::json;

json finish_reason_json(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    default: return nullptr;
  }
}

json usage_json(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens}}}};
}

namespace {

json bytes_of(const std::string& piece) {
  json bytes = json::array();
  for (unsigned char c : piece) bytes.push_back(static_cast<int>(c));
  return bytes;
}

}  // namespace

json logprobs_json(Endpoint endpoint, const std::vector<TokenLogprobs>& logprobs, size_t text_offset) {
  if (logprobs.empty()) return nullptr;
  if (endpoint == Endpoint::kChat) {
    json content = json::array();
    for (const TokenLogprobs& t : logprobs) {
      json top = json::array();
      for (const TokenLogprob& alt : t.top) {
        top.push_back({{"token", sanitize_utf8(alt.piece)}, {"logprob", alt.logprob}, {"bytes", bytes_of(alt.piece)}});
      }
      content.push_back({{"token", sanitize_utf8(t.sampled.piece)},
                         {"logprob", t.sampled.logprob},
                         {"bytes", bytes_of(t.sampled.piece)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}, {"refusal", nullptr}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(), offsets = json::array();
  size_t offset = text_offset;
  for (const TokenLogprobs& t : logprobs) {
    const std::string piece = sanitize_utf8(t.sampled.piece);
    tokens.push_back(piece);
    token_logprobs.push_back(t.sampled.logprob);
    json top = json::object();
    for (const TokenLogprob& alt : t.top) top[sanitize_utf8(alt.piece)] = alt.logprob;
    top_logprobs.push_back(top);
    offsets.push_back(offset);
    offset += t.sampled.piece.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs},
          {"text_offset", offsets}};
}

json full_response(const ResponseHeader& header, const std::vector<ChoiceResult>& choices, const Usage& usage) {
  json out_choices = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& c = choices[i];
    json choice = {{"index", i}, {"finish_reason", finish_reason_json(c.finish)},
                   {"logprobs", logprobs_json(header.endpoint, c.logprobs, 0)}};
    if (header.endpoint == Endpoint::kChat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      choice["text"] = c.text;
    }
    out_choices.push_back(std::move(choice));
  }
  return {{"id", header.id},
          {"object", header.endpoint == Endpoint::kChat ? "chat.completion" : "text_completion"},
          {"created", header.created},
          {"model", header.model},
          {"choices", out_choices},
          {"usage", usage_json(usage)}};
}

json stream_chunk(const ResponseHeader& header, int choice, const json& delta_or_text, FinishReason finish,
                  const json& logprobs, bool include_usage) {
  json c = {{"index", choice}, {"logprobs", logprobs}, {"finish_reason", finish_reason_json(finish)}};
  if (header.endpoint == Endpoint::kChat) {
    c["delta"] = delta_or_text;
  } else {
    c["text"] = delta_or_text;
  }
  json chunk = {{"id", header.id},
                {"object", header.endpoint == Endpoint::kChat ? "chat.completion.chunk" : "text_completion"},
                {"created", header.created},
                {"model", header.model},
                {"choices", json::array({c})}};
  if (include_usage) chunk["usage"] = nullptr;
  return chunk;
}

json usage_chunk(const ResponseHeader& header, const Usage& usage) {
  return {{"id", header.id},
          {"object", header.endpoint == Endpoint::kChat ? "chat.completion.chunk" : "text_completion"},
          {"created", header.created},
          {"model", header.model},
          {"choices", json::array()},
          {"usage", usage_json(usage)}};
}

std::string to_wire(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace kvlm::server
