// The JSON objects of OpenAI's completion and chat APIs: whole responses, stream chunks, usage
// and logprobs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/request.h"
#include "server/openai_request.h"
#include "server/token_logprobs.h"

namespace kvlm::server {

// What every chunk of one response repeats.
struct ResponseHeader {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id;        // cmpl-... / chatcmpl-...
  int64_t created = 0;   // unix seconds
  std::string model;
};

struct ChoiceResult {
  std::string text;
  FinishReason finish = FinishReason::kNone;
  std::vector<TokenLogprobs> logprobs;
  int completion_tokens = 0;
};

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;
};

// "stop" / "length"; null while unfinished.
nlohmann::json finish_reason_json(FinishReason reason);
nlohmann::json usage_json(const Usage& usage);
// Logprobs of a choice's tokens in the endpoint's shape (completions: tokens / token_logprobs /
// top_logprobs / text_offset; chat: content[] with bytes and top_logprobs). null when empty.
nlohmann::json logprobs_json(Endpoint endpoint, const std::vector<TokenLogprobs>& logprobs, size_t text_offset);

// A whole (non-streamed) response.
nlohmann::json full_response(const ResponseHeader& header, const std::vector<ChoiceResult>& choices, const Usage& usage);

// One stream chunk for one choice: chat's delta ({"role"} first, then {"content"}, {} at the end)
// or completions' text. `finish` kNone leaves finish_reason null. With include_usage every chunk
// carries "usage": null, as OpenAI's do.
nlohmann::json stream_chunk(const ResponseHeader& header, int choice, const nlohmann::json& delta_or_text,
                            FinishReason finish, const nlohmann::json& logprobs, bool include_usage);
// The extra chunk with "choices": [] and the usage, before [DONE].
nlohmann::json usage_chunk(const ResponseHeader& header, const Usage& usage);

// JSON text with invalid UTF-8 replaced (never throws on model output).
std::string to_wire(const nlohmann::json& value);

}  // namespace kvlm::server
