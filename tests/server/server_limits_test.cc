// The server's limits (README.md, "Limits"): each is answered with OpenAI's error object naming
// the limit and the `kvlm serve` flag that sets it, and a request inside the limits still runs.
#include <atomic>
#include <thread>

#include <gtest/gtest.h>

#include "server_test_util.h"

namespace kvlm::testing {
namespace {

using nlohmann::json;

struct Reply {
  int status = 0;
  json body;
};

Reply post(httplib::Client& c, const json& body) {
  auto res = c.Post("/v1/completions", body.dump(), "application/json");
  EXPECT_TRUE(res);
  if (!res) return {};
  return {res->status, json::parse(res->body, nullptr, false)};
}

void expect_limit_error(const Reply& r, int status, const std::string& param, const std::string& code,
                        const std::string& flag) {
  EXPECT_EQ(r.status, status) << r.body.dump();
  ASSERT_TRUE(r.body.contains("error")) << r.body.dump();
  const json& e = r.body["error"];
  if (!param.empty()) {
    EXPECT_EQ(e["param"], param) << e.dump();
  }
  EXPECT_EQ(e["code"], code) << e.dump();
  EXPECT_NE(e["message"].get<std::string>().find(flag), std::string::npos) << e.dump();
}

TEST(ServerLimits, MaxTokensAndNCapsNameTheirFlags) {
  KVLM_REQUIRE_STORIES();
  TestServerOptions options;
  options.server.limits.max_tokens = 8;
  options.server.limits.max_n = 2;
  TestServer ts(options);
  auto c = ts.client();
  expect_limit_error(post(c, {{"prompt", "Once"}, {"max_tokens", 9}}), 400, "max_tokens", "limit_exceeded",
                     "at most 8 (--max-tokens)");
  expect_limit_error(post(c, {{"prompt", "Once"}, {"max_completion_tokens", 100}}), 400, "max_completion_tokens",
                     "limit_exceeded", "--max-tokens");
  expect_limit_error(post(c, {{"prompt", "Once"}, {"max_tokens", 2}, {"n", 3}}), 400, "n", "limit_exceeded",
                     "at most 2 (--max-n)");
  EXPECT_EQ(post(c, {{"prompt", "Once"}, {"max_tokens", 8}, {"n", 2}}).status, 200);
  ASSERT_TRUE(ts.wait_idle());
  EXPECT_EQ(ts.engine().leaked_blocks(), 0);
}

TEST(ServerLimits, PromptsOverMaxPromptTokensAreRefusedBeforeTheyRun) {
  KVLM_REQUIRE_STORIES();
  TestServerOptions options;
  options.server.limits.max_prompt_tokens = 6;
  TestServer ts(options);
  auto c = ts.client();
  const json tokens6 = json::array({1, 2, 3, 4, 5, 6});
  const json tokens7 = json::array({1, 2, 3, 4, 5, 6, 7});
  EXPECT_EQ(post(c, {{"prompt", tokens6}, {"max_tokens", 2}}).status, 200);
  expect_limit_error(post(c, {{"prompt", tokens7}, {"max_tokens", 2}}), 400, "prompt", "context_length_exceeded",
                     "at most 6 (--max-prompt-tokens)");
  expect_limit_error(post(c, {{"prompt", "Once upon a time there was a little girl named Lily"}, {"max_tokens", 2}}),
                     400, "prompt", "context_length_exceeded", "--max-prompt-tokens");
  auto chat = c.Post("/v1/chat/completions",
                     json{{"messages", {{{"role", "user"}, {"content", "Tell me a long story about a dog"}}}}}.dump(),
                     "application/json");
  ASSERT_TRUE(chat);
  expect_limit_error({chat->status, json::parse(chat->body)}, 400, "messages", "context_length_exceeded",
                     "--max-prompt-tokens");
  EXPECT_EQ(ts.engine().metrics().requests_finished, 1) << "refused prompts never reach the engine";
  EXPECT_EQ(ts.engine().leaked_blocks(), 0);
}

TEST(ServerLimits, StreamsBeyondMaxStreamsAre429AndWholeResponsesStillRun) {
  KVLM_REQUIRE_STORIES();
  TestServerOptions options;
  options.server.max_streams = 1;
  TestServer ts(options);
  // One long stream holds the only streaming slot until its client lets go.
  std::atomic<int> chunks{0};
  std::atomic<bool> let_go{false};
  std::thread holder([&] {
    auto c = ts.client();
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = json{{"prompt", "Once"}, {"max_tokens", 1500}, {"ignore_eos", true}, {"stream", true}}.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
      ++chunks;
      return !let_go.load();  // false closes the connection
    };
    c.send(req);
  });
  while (chunks.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  auto c = ts.client();
  auto res = c.Post("/v1/completions", json{{"prompt", "a"}, {"max_tokens", 2}, {"stream", true}}.dump(),
                    "application/json");
  ASSERT_TRUE(res);
  expect_limit_error({res->status, json::parse(res->body)}, 429, "", "too_many_streams", "(--max-streams)");
  EXPECT_EQ(res->get_header_value("Retry-After"), "1");
  EXPECT_EQ(post(c, {{"prompt", "a"}, {"max_tokens", 2}}).status, 200) << "a whole response is not a stream";
  let_go = true;
  holder.join();
  ASSERT_TRUE(ts.wait_idle());
  EXPECT_EQ(ts.engine().leaked_blocks(), 0);
}

}  // namespace
}  // namespace kvlm::testing
