// A real kvlm server on a free loopback port over stories260K, and HTTP helpers for its tests.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "chat/chat_format.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "model/llama_model.h"
#include "server/api_server.h"
#include "support/test_paths.h"

namespace kvlm::testing {

// stories260K from ../shared/models, loaded once; null when absent (tests skip).
inline LlamaModel* stories_model() {
  static std::unique_ptr<LlamaModel> model = [] {
    auto path = shared_file("stories260K.gguf");
    return path ? LlamaModel::load(path->string()).value() : nullptr;
  }();
  return model.get();
}

#define KVLM_REQUIRE_STORIES()                                                                  \
  do {                                                                                          \
    if (::kvlm::testing::stories_model() == nullptr) {                                          \
      GTEST_SKIP() << "stories260K.gguf not found in ../shared/models or $KVLM_SHARED/models";  \
    }                                                                                           \
  } while (0)

struct TestServerOptions {
  server::ServerOptions server;
  EngineOptions engine;
  bool attach = true;  // false: the server stays "loading"

  TestServerOptions() {
    server.port = 0;
    server.model_name = "stories260K";
    server.http_threads = 32;
    engine.k_type = engine.v_type = KvType::kF32;
    engine.block_size = 16;
    engine.num_blocks = 256;
    engine.max_seqs = 16;
  }
};

class TestServer {
 public:
  explicit TestServer(TestServerOptions options = {})
      : model_(*stories_model()), pool_(2), server_(options.server) {
    engine_ = Engine::create(model_, pool_, options.engine).value();
    port_ = server_.bind().value();
    server_.start();
    // One response read on this thread before any test thread exists: httplib's client parses
    // status lines with a function-local static regex built inside the uninstrumented
    // libcpp-httplib, whose guard ThreadSanitizer cannot see (two client threads racing to build
    // it read as a data race).
    client().Get("/health");
    if (options.attach) attach();
  }
  ~TestServer() {
    server_.drain(0);
    engine_->stop();
  }

  void attach() {
    engine_->start();
    server_.attach(*engine_, chat::chat_format_for_model(model_.file(), model_.tokenizer()).value());
  }
  void attach_without_chat(const std::string& why) {
    engine_->start();
    server_.attach_without_chat(*engine_, why);
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    return c;
  }
  int port() const { return port_; }
  Engine& engine() { return *engine_; }
  server::ApiServer& server() { return server_; }
  LlamaModel& model() { return model_; }

  // Waits until no request runs or waits (the engine's own view), up to `timeout`.
  bool wait_idle(std::chrono::milliseconds timeout = std::chrono::milliseconds(10000)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      const EngineMetrics m = engine_->metrics();
      if (m.requests_running == 0 && m.requests_waiting == 0 && server_.requests_in_flight() == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }

 private:
  LlamaModel& model_;
  ThreadPool pool_;
  server::ApiServer server_;
  std::unique_ptr<Engine> engine_;
  int port_ = 0;
};

inline nlohmann::json post_json(httplib::Client& c, const std::string& path, const nlohmann::json& body,
                                int* status = nullptr) {
  auto res = c.Post(path, body.dump(), "application/json");
  EXPECT_TRUE(res) << "no response from " << path;
  if (!res) return {};
  if (status != nullptr) *status = res->status;
  return nlohmann::json::parse(res->body);
}

// The `data:` payloads of a Server-Sent Events body, in order ("[DONE]" kept as a string).
inline std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    const std::string event = body.substr(pos, end - pos);
    if (event.rfind("data: ", 0) == 0) out.push_back(event.substr(6));
    pos = end + 2;
  }
  return out;
}

}  // namespace kvlm::testing
