// A slow consumer: a streaming client that stops reading but keeps its socket open. The engine
// keeps stepping everyone else; once the socket's buffers are full and it has accepted nothing
// for --write-timeout, its request is cancelled and its KV blocks go back.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "server_test_util.h"

namespace kvlm::testing {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// A loopback connection with a tiny receive buffer that sends one request and never reads.
class StalledClient {
 public:
  StalledClient(int port, const std::string& path, const json& body) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_GE(fd_, 0);
    int small = 1024;  // set before connect, so the advertised window starts small
    setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    const std::string payload = body.dump();
    const std::string request = "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
                                "Content-Length: " + std::to_string(payload.size()) + "\r\n\r\n" + payload;
    EXPECT_EQ(::send(fd_, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  }
  ~StalledClient() {
    if (fd_ >= 0) ::close(fd_);
  }
  StalledClient(const StalledClient&) = delete;
  StalledClient& operator=(const StalledClient&) = delete;

 private:
  int fd_ = -1;
};

bool wait_for(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return done();
}

// Streams that never end by themselves (a window policy runs past the context, EOS ignored), so
// only the write timeout can end them.
json endless_stream(bool chat) {
  json body = {{"max_tokens", 1 << 20}, {"ignore_eos", true}, {"stream", true}, {"logprobs", chat ? json(true) : json(5)},
               {"kv", {{"policy", "window"}, {"budget", 64}}}};
  if (chat) {
    body["messages"] = {{{"role", "user"}, {"content", "Tell me a story"}}};
    body["top_logprobs"] = 5;  // fatter chunks: the buffers fill sooner
  } else {
    body["prompt"] = "Once upon a time";
  }
  return body;
}

TEST(ServerSlowConsumer, AClientThatStopsReadingIsCancelledWhileOthersComplete) {
  KVLM_REQUIRE_STORIES();
  TestServerOptions options;
  options.server.write_timeout_seconds = 0.5;
  TestServer ts(options);
  const auto started = Clock::now();
  StalledClient completions(ts.port(), "/v1/completions", endless_stream(false));
  StalledClient chat(ts.port(), "/v1/chat/completions", endless_stream(true));
  ASSERT_TRUE(wait_for([&] { return ts.engine().metrics().requests_running == 2; }, std::chrono::seconds(5)));

  // While both stall, other clients are served at full speed, streaming or not.
  for (int i = 0; i < 4; ++i) {
    const auto t0 = Clock::now();
    auto c = ts.client();
    if (i % 2 == 0) {
      int status = 0;
      const json r = post_json(c, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 24}}, &status);
      EXPECT_EQ(status, 200);
      EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
    } else {
      json body = {{"prompt", "The cat"}, {"max_tokens", 24}, {"ignore_eos", true}, {"stream", true}};
      auto res = c.Post("/v1/completions", body.dump(), "application/json");
      ASSERT_TRUE(res);
      EXPECT_EQ(res->status, 200);
      EXPECT_EQ(sse_data(res->body).back(), "[DONE]");
    }
    EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2)) << "request " << i << " waited on the stalled streams";
  }

  // The stalled ones end by themselves: nothing reads them, nobody disconnects.
  ASSERT_TRUE(ts.wait_idle(std::chrono::seconds(20))) << "a stalled stream kept running";
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  const EngineMetrics m = ts.engine().metrics();
  EXPECT_EQ(m.requests_cancelled, 2);
  EXPECT_EQ(m.blocks_used, 0);
  EXPECT_EQ(ts.engine().leaked_blocks(), 0);
  EXPECT_LT(seconds, 15) << "the write timeout is 0.5 s";
}

}  // namespace
}  // namespace kvlm::testing
