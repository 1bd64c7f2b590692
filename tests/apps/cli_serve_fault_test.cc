// `kvlm serve` as a process under faults: SIGTERM while many clients are mid-request (a graceful
// drain: every accepted request completes, new ones get 503, exit 0 with no block held), and the
// model file truncated on disk while it is mapped (one clear line and exit code 3, not "Bus error"
// and never tokens computed from missing weights).
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <regex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "support/serve_process.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// One request of the load: when it was sent, and what came back.
struct Outcome {
  Clock::time_point sent;
  Clock::time_point done;
  bool stream = false;
  bool answered = false;  // an HTTP response came back (not a refused or reset connection)
  int status = 0;
  std::string body;
};

// Whether a 200 carries the whole answer: a stream up to [DONE] without an error event, or a
// completion that stopped at max_tokens.
bool complete_answer(const Outcome& o, int max_tokens) {
  if (o.stream) {
    return o.body.find("data: [DONE]") != std::string::npos && o.body.find("\"error\"") == std::string::npos;
  }
  const json r = json::parse(o.body, nullptr, false);
  return !r.is_discarded() && r["choices"][0]["finish_reason"] == "length" &&
         r["usage"]["completion_tokens"] == max_tokens;
}

TEST(CliServeFault, SigtermUnderLoadCompletesEveryAcceptedRequestAndRefusesNewOnes) {
  // A pool of 48 blocks of 16 tokens for 8 running requests of ~160 tokens each: they preempt.
  testing::ServeProcess serve("cli_serve_fault_sigterm",
                              {"--shutdown-timeout", "60", "--pool-blocks", "48", "--max-seqs", "8", "--max-queue", "8"});
  const int port = serve.wait_ready();
  ASSERT_GT(port, 0) << serve.log();
  constexpr int kClients = 10;
  constexpr int kMaxTokens = 150;
  std::atomic<bool> terminated{false};
  std::mutex mutex;
  std::vector<Outcome> outcomes;
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      httplib::Client http("127.0.0.1", port);
      http.set_read_timeout(120, 0);
      for (int i = 0; !terminated.load() || i == 0; ++i) {
        Outcome o;
        o.stream = (c + i) % 2 == 0;
        const json body = {{"prompt", "Once upon a time, in a land far away, there lived a"},
                           {"max_tokens", kMaxTokens},
                           {"ignore_eos", true},
                           {"stream", o.stream}};
        o.sent = Clock::now();
        auto res = http.Post("/v1/completions", body.dump(), "application/json");
        o.done = Clock::now();
        if (res) {
          o.answered = true;
          o.status = res->status;
          o.body = res->body;
        }
        std::lock_guard<std::mutex> lock(mutex);
        outcomes.push_back(std::move(o));
        if (!res || res->status != 200) break;  // the server is going away
      }
    });
  }
  // SIGTERM once the load is running: every client has sent its first request.
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  const Clock::time_point sigterm_at = Clock::now();
  serve.send_signal(SIGTERM);
  terminated.store(true);
  const int exit_code = serve.wait_exit(std::chrono::seconds(90));
  for (std::thread& t : clients) t.join();
  ASSERT_EQ(exit_code, 0) << serve.log();

  int in_flight_at_sigterm = 0;
  for (const Outcome& o : outcomes) {
    if (o.answered && o.status == 200) {
      EXPECT_TRUE(complete_answer(o, kMaxTokens)) << (o.stream ? "stream" : "completion") << " cut short: " << o.body;
      if (o.sent < sigterm_at && o.done > sigterm_at) ++in_flight_at_sigterm;
    } else if (o.answered) {
      EXPECT_EQ(o.status, 503) << o.body;
      EXPECT_NE(o.body.find("shutting down"), std::string::npos) << o.body;
    } else {
      // No response at all is only right for a request sent after the drain began (the listener
      // then closes); one accepted before it must have been answered.
      EXPECT_GT(o.sent, sigterm_at) << "a request sent before SIGTERM got no response";
    }
  }
  EXPECT_GE(in_flight_at_sigterm, kClients / 2) << "SIGTERM came when the load was running";
  const std::string log = serve.log();
  EXPECT_NE(log.find("SIGTERM: draining"), std::string::npos) << log;
  EXPECT_NE(log.find("stopped: 0 requests cancelled at the deadline, 0 blocks leaked"), std::string::npos) << log;
}

TEST(CliServeFault, SigtermPastTheDrainDeadlineCancelsTheRestAndExitsZero) {
  testing::ServeProcess serve("cli_serve_fault_deadline", {"--shutdown-timeout", "0.3", "--pool-blocks", "256"});
  const int port = serve.wait_ready();
  ASSERT_GT(port, 0) << serve.log();
  constexpr int kStreams = 4;
  std::vector<std::string> bodies(kStreams);
  std::vector<std::thread> clients;
  for (int c = 0; c < kStreams; ++c) {
    clients.emplace_back([&, c] {
      httplib::Client http("127.0.0.1", port);
      http.set_read_timeout(60, 0);
      // Endless: EOS ignored and a window policy that runs past the context, so only the
      // deadline ends it.
      auto res = http.Post("/v1/completions",
                           R"({"prompt": "Once", "max_tokens": 1000000, "ignore_eos": true, "stream": true,
                               "kv": {"policy": "window", "budget": 64}})",
                           "application/json");
      if (res) bodies[static_cast<size_t>(c)] = res->body;
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(serve.terminate_and_wait(), 0) << serve.log();
  for (std::thread& t : clients) t.join();
  // Cut at the deadline, each stream still ends as SSE does: an error event saying why, then [DONE].
  for (const std::string& body : bodies) {
    EXPECT_NE(body.find("the server is shutting down"), std::string::npos) << body.substr(body.size() - std::min<size_t>(body.size(), 600));
    EXPECT_NE(body.find("data: [DONE]"), std::string::npos) << body.substr(body.size() - std::min<size_t>(body.size(), 600));
  }
  const std::string log = serve.log();
  const std::regex stopped(R"(stopped: (\d+) requests cancelled at the deadline, 0 blocks leaked)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m, stopped)) << log;
  EXPECT_EQ(std::stoi(m[1]), kStreams) << log;
}

TEST(CliServeFault, AModelFileTruncatedWhileMappedEndsServeWithOneClearLine) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  const std::filesystem::path copy = testing::scratch_dir("cli_serve_fault_truncated") / "stories260K.gguf";
  std::filesystem::copy_file(model, copy);
  testing::ServeProcess serve("cli_serve_fault_truncated_log", {"--model", copy.string(), "--pool-blocks", "64"});
  const int port = serve.wait_ready();
  ASSERT_GT(port, 0) << serve.log();
  httplib::Client http("127.0.0.1", port);
  http.set_read_timeout(30, 0);
  const std::string body = R"({"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0})";
  auto before = http.Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(before);
  EXPECT_EQ(before->status, 200);

  // What an in-place rewrite or a half-finished copy over the file does: its weights are gone.
  std::filesystem::resize_file(copy, 64 * 1024);
  auto after = http.Post("/v1/completions", body, "application/json");
  EXPECT_FALSE(after && after->status == 200) << "an answer computed from weights no longer on disk: " << after->body;
  EXPECT_EQ(serve.wait_exit(std::chrono::seconds(30)), 3) << serve.log();
  const std::string log = serve.log();
  EXPECT_NE(log.find("kvlm: error: the model file was truncated or changed on disk while mapped: " +
                     std::filesystem::absolute(copy).string()),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("Bus error"), std::string::npos) << log;
}

}  // namespace
}  // namespace kvlm
