// `kvlm serve` as a process (SIGTERM drains and exits 0) and `kvlm chat` reusing earlier turns.
#include <signal.h>

#include <chrono>
#include <regex>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "support/listening_sockets.h"
#include "support/serve_process.h"
#include "support/subprocess.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

using nlohmann::json;
using testing::kvlm_binary;
using testing::run_command;

// `kvlm serve` as a child process whose log goes to cli_serve/serve.log.
class ServeProcess : public testing::ServeProcess {
 public:
  explicit ServeProcess(const std::vector<std::string>& args) : testing::ServeProcess("cli_serve", args) {}
};

TEST(CliServe, SigtermDrainsInFlightStreamsAndExitsZero) {
  ServeProcess serve({"--shutdown-timeout", "0.3", "--pool-blocks", "200"});
  const int port = serve.wait_ready();
  ASSERT_GT(port, 0) << serve.log();
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(30, 0);
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  // A short request finishes; a long stream is still running at SIGTERM.
  auto short_res = c.Post("/v1/completions", R"({"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0})",
                          "application/json");
  ASSERT_TRUE(short_res);
  EXPECT_EQ(short_res->status, 200);
  EXPECT_NE(json::parse(short_res->body)["choices"][0]["text"].get<std::string>().find("there"), std::string::npos);
  std::string streamed;
  std::thread client([&] {
    httplib::Client sc("127.0.0.1", port);
    sc.set_read_timeout(30, 0);
    auto res = sc.Post("/v1/completions", R"({"prompt": "Once", "max_tokens": 1900, "ignore_eos": true, "stream": true})",
                       "application/json");
    if (res) streamed = res->body;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(serve.terminate_and_wait(), 0) << serve.log();
  client.join();
  EXPECT_NE(streamed.find("data: [DONE]"), std::string::npos) << "the stream ended properly";
  const std::string log = serve.log();
  EXPECT_NE(log.find("SIGTERM: draining"), std::string::npos) << log;
  EXPECT_NE(log.find("0 blocks leaked"), std::string::npos) << log;
  // One log line per request, without the prompt text.
  EXPECT_NE(log.find("POST /v1/completions 200 prompt="), std::string::npos) << log;
  EXPECT_EQ(log.find("Once upon a time"), std::string::npos) << "prompts are logged only with --log-prompts";
}

// Security defaults and the limit flags, end to end: without --host only loopback is bound, the
// API key never reaches the log, and the caps given on the command line are what clients get.
TEST(CliServe, DefaultsBindLoopbackOnlyAndTheApiKeyIsNeverLogged) {
  const std::string key = "sk-cli-secret-4242";
  ServeProcess serve({"--api-key", key, "--max-tokens", "8", "--max-prompt-tokens", "64", "--max-streams", "3",
                      "--pool-blocks", "64"});
  const int port = serve.wait_ready();
  ASSERT_GT(port, 0) << serve.log();
  EXPECT_EQ(testing::listening_addresses(port), std::vector<std::string>{"127.0.0.1"});
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(30, 0);
  const std::string body = R"({"prompt": "Once upon a time", "max_tokens": 4})";
  auto wrong = c.Post("/v1/completions", {{"Authorization", "Bearer not-the-key"}}, body, "application/json");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  const httplib::Headers auth = {{"Authorization", "Bearer " + key}};
  auto ok = c.Post("/v1/completions", auth, body, "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  auto capped = c.Post("/v1/completions", auth, R"({"prompt": "Once", "max_tokens": 9})", "application/json");
  ASSERT_TRUE(capped);
  EXPECT_EQ(capped->status, 400);
  EXPECT_NE(capped->body.find("--max-tokens"), std::string::npos) << capped->body;
  auto metrics = c.Get("/metrics", auth);
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->body.find(key), std::string::npos);
  EXPECT_EQ(serve.terminate_and_wait(), 0) << serve.log();
  const std::string log = serve.log();
  EXPECT_NE(log.find("POST /v1/completions 401"), std::string::npos) << log;
  EXPECT_EQ(log.find(key), std::string::npos) << log;
  EXPECT_EQ(log.find("not-the-key"), std::string::npos) << log;
}

TEST(CliServe, BadFlagsAreOneClearLine) {
  auto r = run_command(kvlm_binary() + " serve --pool-blocks 4 --pool-memory 1MiB");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("give one"), std::string::npos) << r.err;
  r = run_command(kvlm_binary() + " serve --port 70000");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--port 70000"), std::string::npos) << r.err;
  r = run_command(kvlm_binary() + " serve --max-prompt-tokens -1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--max-prompt-tokens -1"), std::string::npos) << r.err;
  r = run_command(kvlm_binary() + " serve --max-streams -2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--max-streams -2"), std::string::npos) << r.err;
}

TEST(CliChat, LaterTurnsReuseEarlierTurnsFromThePrefixCache) {
  const auto r = run_command("printf 'Tell me a story about a dog.\\nAnd then what happened?\\n/stats\\n' | " +
                             kvlm_binary() + " chat --temp 0 -n 40");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::regex stats(R"(last turn: prompt (\d+) tokens \((\d+) from the prefix cache)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, stats)) << r.out;
  const int prompt = std::stoi(m[1]);
  const int cached = std::stoi(m[2]);
  EXPECT_GT(cached, 16) << "the first turn's blocks come back";
  EXPECT_LT(cached, prompt);
  EXPECT_NE(r.out.find("pool: 1024 blocks"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace kvlm
