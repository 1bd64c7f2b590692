#include "server/api_server.h"

#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include <httplib.h>
#include <spdlog/spdlog.h>

#include "model/incremental_detokenizer.h"
#include "model/llama_model.h"
#include "model/tokenizer.h"
#include "server/api_error.h"
#include "server/generation_handler.h"
#include "server/generation_session.h"
#include "server/openai_response.h"
#include "server/request_log.h"

namespace kvlm::server {

using nlohmann::json;

namespace {

// Compares in time that depends only on the lengths, so a wrong key's prefix cannot be timed.
bool constant_time_equal(const std::string& a, const std::string& b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = static_cast<unsigned char>(a.size() != b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(to_wire(body), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  if (e.status == 429) res.set_header("Retry-After", "1");
  send_json(res, e.status, e.to_json());
}

}  // namespace

// The route handlers, with access to the server's state.
struct ApiServer::Handlers {
  ApiServer& s;

  void check_auth(const httplib::Request& req) const {
    if (s.options_.api_key.empty()) return;
    const std::string header = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    const std::string given = header.rfind(prefix, 0) == 0 ? header.substr(prefix.size()) : std::string();
    if (!constant_time_equal(given, s.options_.api_key)) {
      throw ApiError(401, header.empty() ? "missing API key: send 'Authorization: Bearer <key>'" : "incorrect API key",
                     "authentication_error", "", "invalid_api_key");
    }
  }

  void check_ready() const {
    switch (s.state_.load()) {
      case State::kLoading: throw ApiError(503, "the model is loading", "service_unavailable", "", "loading");
      case State::kDraining:
        throw ApiError(503, "the server is shutting down", "service_unavailable", "", "shutting_down");
      case State::kReady: return;
    }
  }

  // Runs a handler with the errors every route answers the same way.
  template <typename Fn>
  httplib::Server::Handler guarded(Fn fn, bool needs_auth = true, bool needs_model = true) {
    return [this, fn, needs_auth, needs_model](const httplib::Request& req, httplib::Response& res) {
      try {
        if (needs_auth) check_auth(req);
        if (needs_model) check_ready();
        fn(req, res);
      } catch (const ApiError& e) {
        send_error(res, e);
      } catch (const std::exception& e) {
        spdlog::error("{} {}: {}", req.method, req.path, e.what());
        send_error(res, ApiError(500, std::string("internal error: ") + e.what(), "server_error"));
      }
    };
  }

  void health(const httplib::Request&, httplib::Response& res) {
    switch (s.state_.load()) {
      case State::kLoading: send_json(res, 503, {{"status", "loading"}}); return;
      case State::kDraining: send_json(res, 503, {{"status", "shutting down"}}); return;
      case State::kReady: send_json(res, 200, {{"status", "ok"}}); return;
    }
  }

  void models(const httplib::Request&, httplib::Response& res) {
    const ModelConfig& c = s.engine_->model().config();
    json model = {{"id", s.options_.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "kvlm"},
                  {"meta", {{"n_ctx_train", c.context_length}, {"n_vocab", c.vocab_size},
                            {"n_layer", c.num_layers}, {"kv_block_size", s.engine_->options().block_size},
                            {"kv_blocks", s.engine_->options().num_blocks}}}};
    send_json(res, 200, {{"object", "list"}, {"data", json::array({model})}});
  }

  void metrics(const httplib::Request&, httplib::Response& res) {
    MetricsLabels labels{s.options_.model_name, std::string(kv_type_name(s.engine_->options().k_type)),
                         std::string(kv_type_name(s.engine_->options().v_type))};
    res.status = 200;
    res.set_content(s.metrics_.prometheus_text(s.engine_->metrics(), labels), "text/plain; version=0.0.4");
  }

  void tokenize(const httplib::Request& req, httplib::Response& res) {
    const json body = parse_json_body(req.body);
    auto it = body.find("content");
    if (it == body.end() || !it->is_string()) throw invalid_request("'content' must be a string", "content");
    auto flag = [&](const char* name, bool fallback) {
      auto f = body.find(name);
      if (f == body.end() || f->is_null()) return fallback;
      if (!f->is_boolean()) throw invalid_request(fmt::format("'{}' must be a boolean", name), name);
      return f->get<bool>();
    };
    const Tokenizer& tok = s.engine_->model().tokenizer();
    const bool add_special = flag("add_special", false);
    const bool parse_special = flag("parse_special", true);
    const std::vector<TokenId> ids = tok.encode(it->get<std::string>(), add_special && tok.add_bos(),
                                                parse_special ? SpecialTokens::kParse : SpecialTokens::kAsText);
    json tokens = json::array();
    if (flag("with_pieces", false)) {
      for (TokenId id : ids) tokens.push_back({{"id", id}, {"piece", sanitize_utf8(tok.token_to_piece(id))}});
    } else {
      for (TokenId id : ids) tokens.push_back(id);
    }
    send_json(res, 200, {{"tokens", tokens}});
  }

  void detokenize(const httplib::Request& req, httplib::Response& res) {
    const json body = parse_json_body(req.body);
    auto it = body.find("tokens");
    if (it == body.end() || !it->is_array()) throw invalid_request("'tokens' must be an array of token ids", "tokens");
    const Tokenizer& tok = s.engine_->model().tokenizer();
    std::vector<TokenId> ids;
    for (size_t i = 0; i < it->size(); ++i) {
      const json& v = (*it)[i];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= tok.vocab_size()) {
        throw invalid_request(fmt::format("'tokens[{}]' must be a token id in [0, {})", i, tok.vocab_size()),
                              fmt::format("tokens[{}]", i));
      }
      ids.push_back(static_cast<TokenId>(v.get<int64_t>()));
    }
    send_json(res, 200, {{"content", sanitize_utf8(tok.decode(ids))}});
  }
};

ApiServer::ApiServer(ServerOptions options) : options_(std::move(options)), http_(std::make_unique<httplib::Server>()) {
  // spdlog creates its logger registry on first use, inside libspdlog, which is not built with
  // the sanitizers: ThreadSanitizer cannot see that static's guard and reports the HTTP threads'
  // first log lines as racing. Creating it here, before any of those threads, orders it for both.
  spdlog::default_logger_raw();
}

ApiServer::~ApiServer() {
  http_->stop();
  if (listener_.joinable()) listener_.join();
}

Result<int> ApiServer::bind() {
  auto handlers = std::make_shared<Handlers>(Handlers{*this});
  httplib::Server& svr = *http_;
  // One thread per concurrent stream (a streaming response holds its thread), plus headroom for
  // the short routes.
  int threads = options_.http_threads;
  if (threads <= 0) threads = std::max(16, options_.max_queue + 64 + 16);
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  svr.set_payload_max_length(options_.max_body_bytes);
  svr.set_keep_alive_max_count(1000);
  svr.set_read_timeout(30, 0);
  // httplib waits this long for a socket to take bytes, in every write and in is_writable(); a
  // response handler that gets false cancels its request (generation_handler.cc). Meanwhile the
  // engine keeps stepping every other request; the stalled one's unsent events wait in its
  // session, so what it buffers is bounded by what the engine makes in this time.
  const double write_timeout = std::max(0.001, options_.write_timeout_seconds);
  const auto write_seconds = static_cast<time_t>(write_timeout);
  svr.set_write_timeout(write_seconds,
                        static_cast<time_t>((write_timeout - static_cast<double>(write_seconds)) * 1e6));

  // httplib listens with a backlog of 5; the listening socket's fd is taken here so it can be
  // raised for bursts of connections (listen() again on a listening socket updates it).
  auto listen_fd = std::make_shared<int>(-1);
  svr.set_socket_options([listen_fd](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    // Accepted sockets inherit the listening socket's send buffer: a fixed 256 KiB (the kernel
    // doubles it) instead of Linux's autotuning, which grows a loopback connection's buffer
    // towards tcp_wmem's 4 MiB. A client that stops reading is then noticed once that much is
    // queued plus --write-timeout, not after megabytes: under TSan with a second test beside it,
    // a stalled stream of the slow-consumer test ran 15 s (3054 events) before its first
    // blocked write. 256 KiB still streams 2.5 MB/s at a 100 ms round trip.
    int send_buffer = 256 * 1024;
    setsockopt(sock, SOL_SOCKET, SO_SNDBUF, &send_buffer, sizeof(send_buffer));
    *listen_fd = sock;
  });

  svr.set_pre_routing_handler([](const httplib::Request&, httplib::Response&) {
    request_log().begin();
    return httplib::Server::HandlerResponse::Unhandled;
  });
  svr.Get("/health", handlers->guarded([h = handlers.get()](auto& q, auto& r) { h->health(q, r); }, false, false));
  svr.Get("/metrics", handlers->guarded([h = handlers.get()](auto& q, auto& r) { h->metrics(q, r); }, false));
  svr.Get("/v1/models", handlers->guarded([h = handlers.get()](auto& q, auto& r) { h->models(q, r); }));
  svr.Post("/tokenize", handlers->guarded([h = handlers.get()](auto& q, auto& r) { h->tokenize(q, r); }));
  svr.Post("/detokenize", handlers->guarded([h = handlers.get()](auto& q, auto& r) { h->detokenize(q, r); }));
  svr.Post("/v1/completions", handlers->guarded([this](auto& q, auto& r) {
    handle_generation(*this, Endpoint::kCompletions, q, r);
  }));
  svr.Post("/v1/chat/completions", handlers->guarded([this](auto& q, auto& r) {
    handle_generation(*this, Endpoint::kChat, q, r);
  }));
  // Statuses httplib sets itself (404 for an unknown route, 413 over --max-body, 400 for a
  // malformed request line) get OpenAI's error object too.
  svr.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404) {
      send_error(res, ApiError(404, fmt::format("no route {} {}", req.method, req.path), "not_found_error", "",
                               "unknown_route"));
    } else if (res.status == 413) {
      send_error(res, ApiError(413, fmt::format("the request body is over the limit of {} bytes (--max-body)",
                                                options_.max_body_bytes),
                               "invalid_request_error", "", "request_too_large"));
    } else {
      send_error(res, ApiError(res.status, fmt::format("HTTP {}", res.status), "invalid_request_error"));
    }
  });
  svr.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics_.record_http_status(res.status);
    request_log().finish(req.method, req.path, res.status, options_.log_prompts);
  });
  svr.set_keep_alive_timeout(5);
  handlers_keepalive_ = handlers;

  int port = options_.port;
  if (port == 0) {
    port = svr.bind_to_any_port(options_.host);
    if (port < 0) return Status::errorf("cannot bind {} to any port", options_.host);
  } else if (!svr.bind_to_port(options_.host, port)) {
    return Status::errorf("cannot bind {}:{} (in use, or not an address of this machine)", options_.host, port);
  }
  if (*listen_fd >= 0) ::listen(*listen_fd, options_.listen_backlog);
  return port;
}

void ApiServer::start() {
  listener_ = std::thread([this] { http_->listen_after_bind(); });
}

void ApiServer::attach(Engine& engine, chat::ChatFormat chat_format) {
  engine_ = &engine;
  chat_format_ = std::make_unique<chat::ChatFormat>(std::move(chat_format));
  state_.store(State::kReady);
}

void ApiServer::attach_without_chat(Engine& engine, std::string why) {
  engine_ = &engine;
  chat_unavailable_ = std::move(why);
  state_.store(State::kReady);
}

void ApiServer::track(const std::shared_ptr<GenerationSession>& session) {
  std::lock_guard<std::mutex> lock(drain_mutex_);
  std::erase_if(sessions_, [](const auto& w) { return w.expired(); });
  sessions_.push_back(session);
}

int ApiServer::drain(double timeout_seconds) {
  state_.store(State::kDraining);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  while (in_flight_.load() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  int cancelled = 0;
  if (in_flight_.load() > 0) {
    std::lock_guard<std::mutex> lock(drain_mutex_);
    for (auto& weak : sessions_) {
      if (auto session = weak.lock(); session && !session->all_finished()) {
        session->cancel();
        ++cancelled;
      }
    }
  }
  // Cancelled streams end within a step; give their handlers a moment to write the last event.
  const auto hard_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (in_flight_.load() > 0 && std::chrono::steady_clock::now() < hard_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  http_->stop();
  if (listener_.joinable()) listener_.join();
  return cancelled;
}

}  // namespace kvlm::server
