// Fuzz target openai_request: arbitrary bytes as the body of each endpoint the server validates
// with public functions (server/openai_request.h): /v1/completions and /v1/chat/completions,
// then, for chat, the messages rendered through the chatml template as the server renders them.
// (/tokenize and /detokenize validate inside api_server.cc's handlers, which have no public
// entry point; their JSON goes through the same parse_json_body.)
// Asserted: the only exception is ApiError, a 400 with a message; an accepted request keeps
// within the limits it was parsed under.
#include <string>

#include <nlohmann/json.hpp>

#include "chat/chat_format.h"
#include "chat/chat_template.h"
#include "core/check.h"
#include "fuzz/fuzz_targets.h"
#include "server/api_error.h"
#include "server/openai_request.h"
#include "server/openai_response.h"

namespace kvlm::fuzz {
namespace {

using server::ApiError;
using server::CompletionRequest;
using server::Endpoint;

constexpr int kVocabSize = 512;

void check_error(const ApiError& e) {
  KVLM_CHECK(e.status == 400, "status {} for a bad request", e.status);
  KVLM_CHECK(std::string_view(e.what()).size() > 0, "an ApiError without a message");
  (void)server::to_wire(e.to_json());  // as the server sends it
}

void check_accepted(const CompletionRequest& r, Endpoint endpoint, const server::RequestLimits& limits) {
  KVLM_CHECK(r.n >= 1 && r.n <= limits.max_n, "n {}", r.n);
  KVLM_CHECK(!r.max_tokens || (*r.max_tokens >= 1 && *r.max_tokens <= limits.max_tokens), "max_tokens {}",
             r.max_tokens.value_or(0));
  KVLM_CHECK(static_cast<int>(r.stop.size()) <= limits.max_stop_strings, "{} stop strings", r.stop.size());
  KVLM_CHECK(r.logprobs >= -1 && r.logprobs <= limits.max_logprobs, "logprobs {}", r.logprobs);
  for (const TokenId t : r.prompt_tokens) KVLM_CHECK(t >= 0 && t < kVocabSize, "prompt token {}", t);
  if (endpoint == Endpoint::kChat) {
    KVLM_CHECK(r.messages.is_array() && !r.messages.empty(), "accepted chat without messages");
    for (const auto& m : r.messages) KVLM_CHECK(m.contains("content") && m["content"].is_string(), "message content");
  }
}

// The server renders chat messages with the model's template; chatml stands in for it.
void render_chat(const CompletionRequest& r) {
  static const chat::ChatTemplate chatml = chat::ChatTemplate::parse(chat::chatml_template_source()).value();
  nlohmann::json context = {{"messages", r.messages}, {"add_generation_prompt", true}, {"bos_token", "<s>"},
                            {"eos_token", "</s>"}};
  (void)chatml.render(context);
}

}  // namespace

int openai_request_one_input(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  nlohmann::json parsed;
  try {
    parsed = server::parse_json_body(body);
  } catch (const ApiError& e) {
    check_error(e);
    return 0;
  }
  server::RequestLimits limits;
  limits.max_n = 4;
  limits.max_tokens = 1000;
  limits.max_stop_strings = 4;
  limits.max_logprobs = 5;
  for (const Endpoint endpoint : {Endpoint::kCompletions, Endpoint::kChat}) {
    try {
      const CompletionRequest r = server::parse_completion_request(parsed, endpoint, kVocabSize, limits);
      check_accepted(r, endpoint, limits);
      if (endpoint == Endpoint::kChat) render_chat(r);
    } catch (const ApiError& e) {
      check_error(e);
    }
  }
  return 0;
}

}  // namespace kvlm::fuzz

KVLM_LIBFUZZER_ENTRY(kvlm::fuzz::openai_request_one_input)
