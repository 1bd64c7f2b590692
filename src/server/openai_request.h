// CompletionRequest: a /v1/completions or /v1/chat/completions body, validated field by field.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/ids.h"
#include "engine/sampler.h"
#include "evict/eviction_options.h"

namespace kvlm::server {

enum class Endpoint { kCompletions, kChat };

// Caps a client cannot exceed (the server's limits; exceeding one is a 400 naming the field and,
// for those `kvlm serve` sets, the flag).
struct RequestLimits {
  int max_n = 16;                // --max-n
  int max_tokens = 1 << 20;      // --max-tokens: a cap on max_tokens itself; the context and pool bound it further
  int max_prompt_tokens = 0;     // --max-prompt-tokens: 0 = the model's context (and the pool) alone
  int max_stop_strings = 16;
  int max_logprobs = 20;
};

struct CompletionRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;                     // "" when the client sent none
  // /v1/completions: text, or token ids when the client sent an array.
  std::string prompt_text;
  std::vector<TokenId> prompt_tokens;
  bool prompt_is_tokens = false;
  // /v1/chat/completions: messages with content normalised to a string.
  nlohmann::json messages = nlohmann::json::array();
  std::optional<int> max_tokens;         // max_tokens or max_completion_tokens
  SamplerParams sampler;                 // OpenAI's defaults: temperature 1, top_p 1, no top_k / min_p
  bool has_seed = false;
  std::vector<std::string> stop;
  int n = 1;
  bool stream = false;
  bool include_usage = false;            // stream_options.include_usage
  int logprobs = -1;                     // top alternatives per token; -1 = no logprobs
  bool ignore_eos = false;               // extension (vLLM's): generate past EOS
  EvictionOptions eviction;              // extension: "kv": {"policy", "budget", "sinks", ...}
  std::string cache_salt;                // extension: top level or kv.cache_salt
};

// Throws ApiError (400, naming the field) for malformed JSON values; unknown fields are ignored,
// as OpenAI does. `vocab_size` bounds token-id prompts.
CompletionRequest parse_completion_request(const nlohmann::json& body, Endpoint endpoint, int vocab_size,
                                           const RequestLimits& limits);

// The body as JSON, or ApiError 400 naming the parse error.
nlohmann::json parse_json_body(const std::string& body);

}  // namespace kvlm::server
