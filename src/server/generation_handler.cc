#include "server/generation_handler.h"

#include <chrono>
#include <ctime>

#include <httplib.h>
#include <spdlog/spdlog.h>

#include "model/llama_model.h"
#include "model/tokenizer.h"
#include "server/api_error.h"
#include "server/generation_session.h"
#include "server/openai_response.h"
#include "server/request_log.h"

namespace kvlm::server {

using nlohmann::json;

namespace {

// How often a waiting handler looks for a disconnected client: well under one engine step.
constexpr std::chrono::milliseconds kPollInterval{10};

// Holds `n` units of a server counter (in_flight_: one per choice; streams_: one per stream) for
// as long as the response runs.
class InFlight {
 public:
  InFlight(std::atomic<int>& counter, int n) : counter_(counter), n_(n) { counter_ += n_; }
  ~InFlight() { counter_ -= n_; }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

 private:
  std::atomic<int>& counter_;
  int n_;
};

struct PreparedPrompt {
  std::vector<TokenId> tokens;
  std::vector<TokenId> stop_tokens;
  std::vector<std::string> stop_strings;
  std::string text;  // for --log-prompts
};

PreparedPrompt prepare_prompt(const CompletionRequest& r, const Tokenizer& tok, const chat::ChatFormat* chat_format) {
  PreparedPrompt p;
  if (r.endpoint == Endpoint::kChat) {
    const chat::ChatFormat& format = *chat_format;
    auto rendered = format.render(r.messages, /*add_generation_prompt=*/true);
    if (!rendered.ok()) {
      throw invalid_request("the model's chat template cannot render these messages: " + rendered.status().message(),
                            "messages", "chat_template_error");
    }
    p.text = *rendered;
    p.tokens = format.encode(p.text, tok);
    p.stop_tokens = format.end_of_turn_tokens;
    p.stop_strings = format.end_of_turn_strings;
  } else if (r.prompt_is_tokens) {
    p.tokens = r.prompt_tokens;
  } else {
    p.text = r.prompt_text;
    p.tokens = tok.encode(r.prompt_text, tok.add_bos(), SpecialTokens::kParse);
  }
  if (p.tokens.empty()) throw invalid_request("the prompt is empty", r.endpoint == Endpoint::kChat ? "messages" : "prompt");
  for (const std::string& s : r.stop) p.stop_strings.push_back(s);
  return p;
}

// Picks max_tokens and refuses what can never run: a prompt over the context, or a request the
// pool could not hold even alone. OpenAI's default for completions is 16 tokens; chat runs to
// the end of the context (or of the pool).
int resolve_max_tokens(const CompletionRequest& r, int num_prompt, Engine& engine) {
  const ModelConfig& config = engine.model().config();
  const int context = config.context_length;
  const bool windowed = window_policy(r.eviction.policy);
  const std::string param = r.endpoint == Endpoint::kChat ? "messages" : "prompt";
  if (!windowed && num_prompt >= context) {
    throw invalid_request(fmt::format("This model's maximum context length is {} tokens; the prompt has {} tokens, "
                                      "leaving no room to generate",
                                      context, num_prompt),
                          param, "context_length_exceeded");
  }
  const int pool_tokens = engine.options().num_blocks * engine.options().block_size;
  if (engine.blocks_for_request(r.eviction, num_prompt + 1) > engine.options().num_blocks) {
    throw invalid_request(fmt::format("the prompt has {} tokens; the KV pool holds {} tokens ({} blocks of {}), so "
                                      "it can never run",
                                      num_prompt, pool_tokens, engine.options().num_blocks, engine.options().block_size),
                          param, "context_length_exceeded");
  }
  int room = windowed ? (1 << 30) : context - num_prompt;
  if (r.max_tokens) {
    if (!windowed && *r.max_tokens > room) {
      throw invalid_request(fmt::format("This model's maximum context length is {} tokens; you requested {} tokens "
                                        "({} in the prompt, {} for the completion)",
                                        context, num_prompt + *r.max_tokens, num_prompt, *r.max_tokens),
                            "max_tokens", "context_length_exceeded");
    }
    if (engine.blocks_for_request(r.eviction, num_prompt + *r.max_tokens) > engine.options().num_blocks) {
      throw invalid_request(fmt::format("{} prompt + {} completion tokens need more than the KV pool's {} blocks of {}",
                                        num_prompt, *r.max_tokens, engine.options().num_blocks,
                                        engine.options().block_size),
                            "max_tokens", "context_length_exceeded");
    }
    return *r.max_tokens;
  }
  if (r.endpoint == Endpoint::kCompletions) room = std::min(room, 16);
  // Up to what one request alone can hold in the pool.
  int fits = std::min(room, std::max(1, pool_tokens - num_prompt));
  while (fits > 1 && engine.blocks_for_request(r.eviction, num_prompt + fits) > engine.options().num_blocks) {
    fits -= engine.options().block_size;
  }
  return std::max(1, fits);
}

std::string new_id(Endpoint endpoint, uint64_t n) {
  return fmt::format("{}-{:x}{:08x}", endpoint == Endpoint::kChat ? "chatcmpl" : "cmpl",
                     static_cast<uint64_t>(std::time(nullptr)), n);
}

std::string sse(const json& value) { return "data: " + to_wire(value) + "\n\n"; }

}  // namespace

void handle_generation(ApiServer& server, Endpoint endpoint, const httplib::Request& req, httplib::Response& res) {
  Engine& engine = *server.engine_;
  const Tokenizer& tok = engine.model().tokenizer();
  const json body = parse_json_body(req.body);
  CompletionRequest r = parse_completion_request(body, endpoint, tok.vocab_size(), server.options_.limits);
  if (!r.model.empty() && r.model != server.options_.model_name) {
    throw ApiError(404, fmt::format("The model '{}' does not exist; this server serves '{}'", r.model,
                                    server.options_.model_name),
                   "invalid_request_error", "model", "model_not_found");
  }
  if (endpoint == Endpoint::kChat && server.chat_format_ == nullptr) {
    throw invalid_request("this model's chat template cannot be used: " + server.chat_unavailable_ +
                              "; /v1/completions with your own prompt text still works",
                          "messages", "chat_template_error");
  }
  PreparedPrompt prompt = prepare_prompt(r, tok, server.chat_format_.get());
  const int max_prompt_tokens = server.options_.limits.max_prompt_tokens;
  if (max_prompt_tokens > 0 && static_cast<int>(prompt.tokens.size()) > max_prompt_tokens) {
    throw invalid_request(fmt::format("the prompt has {} tokens; this server allows at most {} (--max-prompt-tokens)",
                                      prompt.tokens.size(), max_prompt_tokens),
                          endpoint == Endpoint::kChat ? "messages" : "prompt", "context_length_exceeded");
  }
  const int max_tokens = resolve_max_tokens(r, static_cast<int>(prompt.tokens.size()), engine);

  // Admission control: beyond the running batch and the queue, ask the client to come back.

  RequestOptions options;
  options.prompt = prompt.tokens;
  options.sampler = r.sampler;
  if (!r.has_seed) options.sampler.seed = std::random_device{}() ^ (static_cast<uint64_t>(std::random_device{}()) << 32);
  options.max_tokens = max_tokens;
  options.stop_at_eos = !r.ignore_eos;
  options.stop_tokens = prompt.stop_tokens;
  options.stop_strings = prompt.stop_strings;
  options.eviction = r.eviction;
  options.cache_salt = r.cache_salt;

  // Counted before it is checked, so a burst cannot slip past the limit between the two.
  auto in_flight = std::make_shared<InFlight>(server.in_flight_, r.n);
  const EngineOptions& eo = engine.options();
  if (server.in_flight_.load() > eo.max_seqs + server.options_.max_queue) {
    throw ApiError(429, fmt::format("the server is at capacity ({} requests running or queued); retry shortly",
                                    eo.max_seqs + server.options_.max_queue),
                   "rate_limit_error", "", "queue_full");
  }
  std::shared_ptr<InFlight> stream_slot;
  if (r.stream) {
    stream_slot = std::make_shared<InFlight>(server.streams_, 1);
    const int max_streams = server.options_.max_streams;
    if (max_streams > 0 && server.streams_.load() > max_streams) {
      throw ApiError(429, fmt::format("the server is streaming {} responses, its limit (--max-streams); retry shortly",
                                      max_streams),
                     "rate_limit_error", "", "too_many_streams");
    }
  }
  auto session = std::make_shared<GenerationSession>(engine, std::move(options), r.n, r.logprobs);
  Status started = session->start();
  if (!started.ok()) {
    const bool too_long = started.message().find("context") != std::string::npos ||
                          started.message().find("block") != std::string::npos;
    throw invalid_request(started.message(), too_long ? "prompt" : "", too_long ? "context_length_exceeded" : "");
  }
  server.track(session);

  RequestLog& handler_log = request_log();
  handler_log.prompt_tokens = static_cast<int>(prompt.tokens.size());
  if (server.options_.log_prompts) handler_log.prompt = prompt.text;

  const ResponseHeader header{endpoint, new_id(endpoint, server.next_id_++), static_cast<int64_t>(std::time(nullptr)),
                              server.options_.model_name};
  const bool stream = r.stream;
  const bool include_usage = r.include_usage;
  const int num_prompt = static_cast<int>(prompt.tokens.size());
  const double timeout = server.options_.request_timeout_seconds;
  const EvictionPolicy policy = r.eviction.policy;
  ServerMetrics& metrics = server.metrics_;

  auto provider = [=, &metrics](size_t, httplib::DataSink& sink) {
    RequestLog& log = request_log();
    const auto started_at = std::chrono::steady_clock::now();
    std::vector<ChoiceResult> choices(session->num_choices());
    std::vector<size_t> streamed_offset(session->num_choices(), 0);
    Usage usage;
    usage.prompt_tokens = num_prompt;
    int finished = 0;
    bool client_gone = false;
    bool timed_out = false;
    std::string error;  // the first choice's error: the response reports it
    bool write_failed = false;
    auto write = [&](const std::string& data) {
      if (client_gone || write_failed) return;
      if (!sink.write(data.data(), data.size())) write_failed = true;
    };
    if (stream && endpoint == Endpoint::kChat) {
      for (int i = 0; i < session->num_choices(); ++i) {
        write(sse(stream_chunk(header, i, {{"role", "assistant"}, {"content", ""}}, FinishReason::kNone, nullptr,
                               include_usage)));
      }
    }
    while (finished < session->num_choices()) {
      if (!client_gone && (write_failed || !sink.is_writable())) {
        client_gone = true;  // its blocks go back within a step
        session->cancel();
      }
      if (!timed_out && timeout > 0 &&
          std::chrono::steady_clock::now() - started_at > std::chrono::duration<double>(timeout)) {
        timed_out = true;
        session->cancel();
      }
      std::optional<ChoiceEvent> event = session->next_event(kPollInterval);
      if (!event) continue;
      ChoiceResult& c = choices[event->choice];
      c.text += event->text;
      if (event->logprobs) c.logprobs.push_back(*event->logprobs);
      if (stream && (!event->text.empty() || event->logprobs)) {
        json logprobs = nullptr;
        if (event->logprobs) logprobs = logprobs_json(endpoint, {*event->logprobs}, streamed_offset[event->choice]);
        const json delta = endpoint == Endpoint::kChat ? json{{"content", event->text}} : json(event->text);
        write(sse(stream_chunk(header, event->choice, delta, FinishReason::kNone, logprobs, include_usage)));
      }
      streamed_offset[event->choice] += event->text.size();
      if (event->finish == FinishReason::kNone) continue;
      ++finished;
      c.finish = event->finish;
      metrics.record(RequestOutcome{event->finish, event->stats ? &*event->stats : nullptr, policy});
      if (event->stats) {
        c.completion_tokens = event->stats->completion_tokens;
        usage.completion_tokens += event->stats->completion_tokens;
        if (event->choice == 0) {
          usage.cached_tokens = event->stats->cached_prompt_tokens;
          log.time_to_first_token = event->stats->completion_tokens > 0 ? event->stats->time_to_first_token : -1;
        }
      }
      if (event->finish == FinishReason::kError && error.empty()) error = event->error;
      if (event->finish == FinishReason::kError) session->cancel();  // the response fails as a whole
      if (stream && (event->finish == FinishReason::kStop || event->finish == FinishReason::kLength)) {
        write(sse(stream_chunk(header, event->choice, endpoint == Endpoint::kChat ? json::object() : json(""),
                               event->finish, nullptr, include_usage)));
      }
    }
    log.cached_tokens = usage.cached_tokens;
    log.completion_tokens = usage.completion_tokens;
    if (client_gone) {
      log.note = "cancelled: client disconnected or stopped reading (--write-timeout)";
      return false;  // nothing more can be written; httplib closes the connection
    }
    std::optional<ApiError> failure;
    if (!error.empty()) {
      failure = ApiError(500, "generation failed: " + error, "server_error");
    } else if (!stream) {
      // A whole response's status line went out when the provider started (httplib writes it
      // first), so a timeout or a shutdown cancel ends the choices like max_tokens would:
      // the text so far with finish_reason "length", never an error object under a 200.
      for (ChoiceResult& c : choices) {
        if (c.finish == FinishReason::kCancelled) c.finish = FinishReason::kLength;
      }
      if (timed_out) log.note = "ended by --request-timeout";
    } else if (timed_out) {
      failure = ApiError(504, fmt::format("the request ran past the server's timeout of {} s (--request-timeout)", timeout),
                         "timeout_error", "", "timeout");
    } else {
      for (const ChoiceResult& c : choices) {
        if (c.finish == FinishReason::kCancelled) {
          failure = ApiError(503, "the request was cancelled: the server is shutting down", "service_unavailable", "",
                             "shutting_down");
        }
      }
    }
    if (failure) log.note = failure->what();
    if (stream) {
      if (failure) {
        write(sse(failure->to_json()));  // in-band: the status line went out with the first chunk
      } else if (include_usage) {
        write(sse(usage_chunk(header, usage)));
      }
      write("data: [DONE]\n\n");
    } else {
      write(to_wire(failure ? failure->to_json() : full_response(header, choices, usage)));
    }
    if (write_failed) return false;
    sink.done();
    return true;
  };
  // The releaser runs however the response ends, so a request never outlives its client.
  auto releaser = [session, in_flight, stream_slot](bool) mutable {
    session->cancel();
    in_flight.reset();
    stream_slot.reset();
  };
  res.status = 200;
  if (stream) {
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider("text/event-stream", provider, releaser);
  } else {
    res.set_chunked_content_provider("application/json", provider, releaser);
  }
}

}  // namespace kvlm::server
