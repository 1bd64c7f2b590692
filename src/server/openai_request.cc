#include "server/openai_request.h"

#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "server/api_error.h"

namespace kvlm::server {
namespace {

using nlohmann::json;

// A field that is absent or null reads as "not given", as in OpenAI's API.
const json* field(const json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

[[noreturn]] void wrong_type(const std::string& param, const char* expected) {
  throw invalid_request(fmt::format("'{}' must be {}", param, expected), param);
}

bool read_bool(const json& value, const std::string& param) {
  if (!value.is_boolean()) wrong_type(param, "a boolean");
  return value.get<bool>();
}

int64_t read_int(const json& value, const std::string& param, int64_t lo, int64_t hi) {
  if (!value.is_number_integer()) wrong_type(param, "an integer");
  int64_t v = 0;
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    v = u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max()
                                                                        : static_cast<int64_t>(u);
  } else {
    v = value.get<int64_t>();
  }
  if (v < lo || v > hi) {
    throw invalid_request(fmt::format("'{}' is {}; it must be in [{}, {}]", param, v, lo, hi), param);
  }
  return v;
}

// A value the server caps (RequestLimits): over the cap, the error names the limit and its flag.
int64_t read_capped(const json& value, const std::string& param, int64_t lo, int64_t cap, const char* flag) {
  const int64_t v = read_int(value, param, lo, std::numeric_limits<int64_t>::max());
  if (v > cap) {
    throw invalid_request(fmt::format("'{}' is {}; this server allows at most {} ({})", param, v, cap, flag), param,
                          "limit_exceeded");
  }
  return v;
}

double read_number(const json& value, const std::string& param, double lo, double hi) {
  if (!value.is_number()) wrong_type(param, "a number");
  const double v = value.get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) {
    throw invalid_request(fmt::format("'{}' is {}; it must be in [{}, {}]", param, v, lo, hi), param);
  }
  return v;
}

std::string read_string(const json& value, const std::string& param) {
  if (!value.is_string()) wrong_type(param, "a string");
  return value.get<std::string>();
}

// "content" may be a string or OpenAI's array of parts; only text parts carry meaning here.
std::string message_content(const json& content, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) wrong_type(param, "a string or an array of content parts");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string part_param = fmt::format("{}[{}]", param, i);
    const json& part = content[i];
    if (!part.is_object()) wrong_type(part_param, "an object");
    const json* type = field(part, "type");
    if (type == nullptr || !type->is_string()) wrong_type(part_param + ".type", "a string");
    if (*type != "text") {
      throw invalid_request(
          fmt::format("'{}.type' is '{}'; this server reads text parts only", part_param, type->get<std::string>()),
          part_param + ".type");
    }
    const json* part_text = field(part, "text");
    if (part_text == nullptr) wrong_type(part_param + ".text", "a string");
    text += read_string(*part_text, part_param + ".text");
  }
  return text;
}

json read_messages(const json& value) {
  if (!value.is_array()) wrong_type("messages", "an array of messages");
  if (value.empty()) throw invalid_request("'messages' must hold at least one message", "messages");
  json out = json::array();
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string param = fmt::format("messages[{}]", i);
    const json& m = value[i];
    if (!m.is_object()) wrong_type(param, "an object");
    const json* role = field(m, "role");
    if (role == nullptr) throw invalid_request(fmt::format("'{}.role' is missing", param), param + ".role");
    const std::string role_name = read_string(*role, param + ".role");
    if (role_name != "system" && role_name != "user" && role_name != "assistant" && role_name != "tool" &&
        role_name != "developer") {
      throw invalid_request(
          fmt::format("'{}.role' is '{}'; expected system, developer, user, assistant or tool", param, role_name),
          param + ".role");
    }
    json message = m;  // other fields (name, tool_calls, ...) pass to the template unchanged
    const json* content = field(m, "content");
    if (content == nullptr) {
      if (role_name != "assistant") {
        throw invalid_request(fmt::format("'{}.content' is missing", param), param + ".content");
      }
      message["content"] = "";
    } else {
      message["content"] = message_content(*content, param + ".content");
    }
    out.push_back(std::move(message));
  }
  return out;
}

std::vector<std::string> read_stop(const json& value, const RequestLimits& limits) {
  std::vector<std::string> stop;
  if (value.is_string()) {
    stop.push_back(value.get<std::string>());
  } else if (value.is_array()) {
    for (size_t i = 0; i < value.size(); ++i) stop.push_back(read_string(value[i], fmt::format("stop[{}]", i)));
  } else {
    wrong_type("stop", "a string or an array of strings");
  }
  if (static_cast<int>(stop.size()) > limits.max_stop_strings) {
    throw invalid_request(fmt::format("'stop' holds {} strings; at most {}", stop.size(), limits.max_stop_strings),
                          "stop");
  }
  for (const std::string& s : stop) {
    if (s.empty()) throw invalid_request("'stop' strings must not be empty", "stop");
  }
  return stop;
}

void read_prompt(const json& value, int vocab_size, CompletionRequest& r) {
  if (value.is_string()) {
    r.prompt_text = value.get<std::string>();
    return;
  }
  if (value.is_array() && !value.empty() && value[0].is_number_integer()) {
    r.prompt_is_tokens = true;
    for (size_t i = 0; i < value.size(); ++i) {
      r.prompt_tokens.push_back(
          static_cast<TokenId>(read_int(value[i], fmt::format("prompt[{}]", i), 0, vocab_size - 1)));
    }
    return;
  }
  if (value.is_array() && value.size() == 1 && value[0].is_string()) {  // ["text"]: one prompt
    r.prompt_text = value[0].get<std::string>();
    return;
  }
  if (value.is_array() && value.size() > 1) {
    throw invalid_request("'prompt' as a batch of several prompts is not supported; send one request per prompt",
                          "prompt");
  }
  wrong_type("prompt", "a string or an array of token ids");
}

// validate_eviction_options names the CLI's flags; a request names its fields.
std::string kv_field_names(std::string message) {
  const std::pair<const char*, const char*> names[] = {
      {"--snapkv-window", "kv.snapkv_window"}, {"--snapkv-kernel", "kv.snapkv_kernel"},
      {"--evicting-step", "kv.evicting_step"}, {"--budget", "kv.budget"}, {"--sinks", "kv.sinks"},
      {"--recent", "kv.recent"}, {"--policy", "kv.policy"}};
  for (const auto& [flag, field] : names) {
    for (size_t at = message.find(flag); at != std::string::npos; at = message.find(flag, at)) {
      message.replace(at, std::strlen(flag), field);
      at += std::strlen(field);
    }
  }
  return message;
}

void read_kv_extension(const json& kv, CompletionRequest& r) {
  if (!kv.is_object()) wrong_type("kv", "an object");
  if (const json* v = field(kv, "policy")) {
    const std::string name = read_string(*v, "kv.policy");
    auto policy = parse_eviction_policy(name);
    if (!policy.ok()) throw invalid_request("'kv.policy': " + policy.status().message(), "kv.policy");
    r.eviction.policy = *policy;
  }
  if (const json* v = field(kv, "budget")) r.eviction.budget = static_cast<int>(read_int(*v, "kv.budget", 1, 1 << 30));
  if (const json* v = field(kv, "sinks")) r.eviction.sinks = static_cast<int>(read_int(*v, "kv.sinks", 0, 1 << 30));
  if (const json* v = field(kv, "recent")) r.eviction.recent = static_cast<int>(read_int(*v, "kv.recent", 0, 1 << 30));
  if (const json* v = field(kv, "snapkv_window")) {
    r.eviction.snapkv_window = static_cast<int>(read_int(*v, "kv.snapkv_window", 1, 1 << 30));
  }
  if (const json* v = field(kv, "snapkv_kernel")) {
    r.eviction.snapkv_kernel = static_cast<int>(read_int(*v, "kv.snapkv_kernel", 1, 1 << 30));
  }
  if (const json* v = field(kv, "evicting_step")) {
    r.eviction.evicting_step = static_cast<int>(read_int(*v, "kv.evicting_step", 1, 1 << 30));
  }
  if (const json* v = field(kv, "cache_salt")) r.cache_salt = read_string(*v, "kv.cache_salt");
  if (r.eviction.policy == EvictionPolicy::kNone && field(kv, "budget") != nullptr) {
    throw invalid_request("'kv.budget' needs 'kv.policy'", "kv.budget");
  }
  if (r.eviction.policy != EvictionPolicy::kNone) {
    Status valid = validate_eviction_options(r.eviction);
    if (!valid.ok()) throw invalid_request("'kv': " + kv_field_names(valid.message()), "kv");
  }
}

}  // namespace

// Deeper bodies are refused while parsing: copying or printing a JSON value recurses once per
// level, so 100,000 nested brackets (200 KB, well under the body limit) would overflow the stack.
// Tool schemas, the deepest part of a real request, nest a few dozen levels.
constexpr int kMaxJsonDepth = 128;

json parse_json_body(const std::string& body) {
  json parsed;
  try {
    parsed = json::parse(body, [](int depth, json::parse_event_t, json&) {
      if (depth > kMaxJsonDepth) {
        throw invalid_request(fmt::format("the body nests JSON more than {} levels deep", kMaxJsonDepth));
      }
      return true;
    });
  } catch (const json::exception& e) {  // parse_error (with the byte position) or out_of_range (a number too large)
    throw invalid_request(fmt::format("the body is not valid JSON ({})", e.what()));
  }
  if (!parsed.is_object()) throw invalid_request("the body must be a JSON object");
  return parsed;
}

CompletionRequest parse_completion_request(const json& body, Endpoint endpoint, int vocab_size,
                                           const RequestLimits& limits) {
  CompletionRequest r;
  r.endpoint = endpoint;
  // OpenAI's defaults, not kvlm run's: plain sampling from the model's distribution.
  r.sampler.temperature = 1.0f;
  r.sampler.top_p = 1.0f;
  r.sampler.top_k = 0;
  r.sampler.min_p = 0.0f;
  r.sampler.repeat_penalty = 1.0f;

  if (const json* v = field(body, "model")) r.model = read_string(*v, "model");
  if (endpoint == Endpoint::kChat) {
    const json* messages = field(body, "messages");
    if (messages == nullptr) throw invalid_request("'messages' is required", "messages");
    r.messages = read_messages(*messages);
  } else {
    const json* prompt = field(body, "prompt");
    if (prompt == nullptr) throw invalid_request("'prompt' is required", "prompt");
    read_prompt(*prompt, vocab_size, r);
  }
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    if (const json* v = field(body, name)) {
      r.max_tokens = static_cast<int>(read_capped(*v, name, 1, limits.max_tokens, "--max-tokens"));
    }
  }
  if (const json* v = field(body, "temperature")) r.sampler.temperature = static_cast<float>(read_number(*v, "temperature", 0, 2));
  if (const json* v = field(body, "top_p")) {
    r.sampler.top_p = static_cast<float>(read_number(*v, "top_p", 0, 1));
    if (r.sampler.top_p <= 0) throw invalid_request("'top_p' must be greater than 0", "top_p");
  }
  if (const json* v = field(body, "top_k")) {
    const int64_t k = read_int(*v, "top_k", -1, 1 << 30);
    r.sampler.top_k = k < 0 ? 0 : static_cast<int>(k);  // -1 (vLLM) and 0 both mean off
  }
  if (const json* v = field(body, "min_p")) r.sampler.min_p = static_cast<float>(read_number(*v, "min_p", 0, 1));
  if (const json* v = field(body, "repetition_penalty")) {
    r.sampler.repeat_penalty = static_cast<float>(read_number(*v, "repetition_penalty", 0.01, 100));
  }
  if (const json* v = field(body, "seed")) {
    r.sampler.seed = static_cast<uint64_t>(
        read_int(*v, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
    r.has_seed = true;
  }
  if (const json* v = field(body, "stop")) r.stop = read_stop(*v, limits);
  if (const json* v = field(body, "n")) r.n = static_cast<int>(read_capped(*v, "n", 1, limits.max_n, "--max-n"));
  if (const json* v = field(body, "stream")) r.stream = read_bool(*v, "stream");
  if (const json* v = field(body, "stream_options")) {
    if (!v->is_object()) wrong_type("stream_options", "an object");
    if (!r.stream) throw invalid_request("'stream_options' is only allowed with 'stream': true", "stream_options");
    if (const json* u = field(*v, "include_usage")) r.include_usage = read_bool(*u, "stream_options.include_usage");
  }
  if (endpoint == Endpoint::kCompletions) {
    // Legacy completions: "logprobs" is the number of alternatives (0 = just the sampled token's).
    if (const json* v = field(body, "logprobs")) r.logprobs = static_cast<int>(read_int(*v, "logprobs", 0, limits.max_logprobs));
  } else {
    bool want = false;
    if (const json* v = field(body, "logprobs")) want = read_bool(*v, "logprobs");
    if (const json* v = field(body, "top_logprobs")) {
      const int top = static_cast<int>(read_int(*v, "top_logprobs", 0, limits.max_logprobs));
      if (!want) throw invalid_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
      r.logprobs = top;
    } else if (want) {
      r.logprobs = 0;
    }
  }
  if (const json* v = field(body, "ignore_eos")) r.ignore_eos = read_bool(*v, "ignore_eos");
  if (const json* v = field(body, "kv")) read_kv_extension(*v, r);
  if (const json* v = field(body, "cache_salt")) r.cache_salt = read_string(*v, "cache_salt");
  if ((field(body, "cache_salt") != nullptr || (field(body, "kv") && field(*field(body, "kv"), "cache_salt"))) &&
      r.cache_salt.empty()) {
    throw invalid_request("'cache_salt' must be a non-empty string", "cache_salt");
  }
  if (const json* v = field(body, "echo")) {
    if (read_bool(*v, "echo")) throw invalid_request("'echo' is not supported", "echo");
  }
  if (const json* v = field(body, "best_of")) {
    if (read_int(*v, "best_of", 1, limits.max_n) != r.n) {
      throw invalid_request("'best_of' other than n is not supported", "best_of");
    }
  }
  return r;
}

}  // namespace kvlm::server
