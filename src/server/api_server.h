// ApiServer: `kvlm serve`, the OpenAI-compatible HTTP API over one Engine.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "chat/chat_format.h"
#include "core/status.h"
#include "engine/engine.h"
#include "server/openai_request.h"
#include "server/server_metrics.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}

namespace kvlm::server {

class GenerationSession;

struct ServerOptions {
  std::string host = "127.0.0.1";  // loopback unless told otherwise
  int port = 8080;                 // 0: any free port (bind() returns it)
  std::string api_key;             // "" = no authentication
  std::string model_name;          // the id /v1/models lists and requests may name
  int max_queue = 256;             // requests waiting beyond the engine's running batch
  int max_streams = 0;             // streaming responses at once (429 beyond); 0: only max_queue bounds them
  size_t max_body_bytes = 8u << 20;
  double request_timeout_seconds = 600;  // 0 = none
  // A client that accepts no bytes for this long (a slow consumer: it stopped reading but keeps
  // the socket open) is treated as gone: its request is cancelled and its KV blocks go back.
  double write_timeout_seconds = 30;
  int http_threads = 0;            // 0: enough for max_seqs + max_queue streams
  int listen_backlog = 1024;
  bool log_prompts = false;
  RequestLimits limits;
};

// Lifecycle: bind() and start() first (GET /health answers 503 "loading"), attach() the loaded
// model's engine (the engine runs its own thread), then drain() on shutdown: new requests get
// 503, in-flight ones finish up to the timeout, the rest are cancelled, the listener stops.
class ApiServer {
 public:
  explicit ApiServer(ServerOptions options);
  ~ApiServer();
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  Result<int> bind();  // the port bound
  void start();        // serves on a thread of its own
  void attach(Engine& engine, chat::ChatFormat chat_format);
  // A model whose chat template cannot be parsed still serves completions; its chat requests
  // are a 400 `chat_template_error` carrying `why`.
  void attach_without_chat(Engine& engine, std::string why);
  // Returns the number of requests that had to be cancelled at the deadline.
  int drain(double timeout_seconds);
  // Requests being generated (each choice counts).
  int requests_in_flight() const { return in_flight_.load(); }
  const ServerOptions& options() const { return options_; }

 private:
  struct Handlers;
  friend struct Handlers;
  friend void handle_generation(ApiServer& server, Endpoint endpoint, const httplib::Request& req,
                                httplib::Response& res);
  void track(const std::shared_ptr<GenerationSession>& session);  // so drain() can cancel it

  enum class State { kLoading, kReady, kDraining };

  ServerOptions options_;
  std::unique_ptr<httplib::Server> http_;
  std::thread listener_;
  std::atomic<State> state_{State::kLoading};
  std::atomic<int> in_flight_{0};
  std::atomic<int> streams_{0};          // streaming responses open now (options_.max_streams)
  Engine* engine_ = nullptr;             // set once by attach(), before state_ becomes kReady
  std::unique_ptr<chat::ChatFormat> chat_format_;  // null: see chat_unavailable_
  std::string chat_unavailable_;
  ServerMetrics metrics_;
  std::atomic<uint64_t> next_id_{0};
  std::mutex drain_mutex_;
  std::vector<std::weak_ptr<GenerationSession>> sessions_;  // for drain's cancellation
  std::shared_ptr<Handlers> handlers_keepalive_;
};

}  // namespace kvlm::server
