// Every error a client can cause, with its status and OpenAI's error object; none leaks a block.
#include <gtest/gtest.h>

#include "server_test_util.h"

namespace kvlm::testing {
namespace {

using nlohmann::json;

struct ErrorReply {
  int status = 0;
  json error;
  std::string retry_after;
};

ErrorReply post_raw(httplib::Client& c, const std::string& path, const std::string& body,
                    const httplib::Headers& headers = {}) {
  auto res = c.Post(path, headers, body, "application/json");
  EXPECT_TRUE(res);
  if (!res) return {};
  ErrorReply r;
  r.status = res->status;
  r.retry_after = res->get_header_value("Retry-After");
  const json parsed = json::parse(res->body, nullptr, false);
  if (parsed.is_object() && parsed.contains("error")) r.error = parsed["error"];
  return r;
}

void expect_error_object(const ErrorReply& r, int status, const std::string& type, const std::string& param = "",
                         const std::string& code = "") {
  EXPECT_EQ(r.status, status);
  ASSERT_TRUE(r.error.is_object()) << "status " << r.status;
  EXPECT_TRUE(r.error["message"].is_string());
  EXPECT_FALSE(r.error["message"].get<std::string>().empty());
  EXPECT_EQ(r.error["type"], type);
  ASSERT_TRUE(r.error.contains("param"));
  ASSERT_TRUE(r.error.contains("code"));
  if (!param.empty()) {
    EXPECT_EQ(r.error["param"], param) << r.error.dump();
  }
  if (!code.empty()) {
    EXPECT_EQ(r.error["code"], code) << r.error.dump();
  }
}

TEST(ServerErrors, MalformedBodiesAndFieldsAre400NamingTheField) {
  KVLM_REQUIRE_STORIES();
  TestServer ts;
  auto c = ts.client();
  expect_error_object(post_raw(c, "/v1/completions", "{not json"), 400, "invalid_request_error");
  expect_error_object(post_raw(c, "/v1/completions", "[1, 2]"), 400, "invalid_request_error");
  expect_error_object(post_raw(c, "/v1/completions", R"({"max_tokens": 4})"), 400, "invalid_request_error", "prompt");
  const std::pair<const char*, const char*> cases[] = {
      {R"({"prompt": "a", "temperature": "hot"})", "temperature"},
      {R"({"prompt": "a", "temperature": 7})", "temperature"},
      {R"({"prompt": "a", "max_tokens": 0})", "max_tokens"},
      {R"({"prompt": "a", "max_tokens": 2.5})", "max_tokens"},
      {R"({"prompt": "a", "top_p": 0})", "top_p"},
      {R"({"prompt": "a", "n": 0})", "n"},
      {R"({"prompt": "a", "n": 1000})", "n"},
      {R"({"prompt": "a", "stop": 5})", "stop"},
      {R"({"prompt": "a", "stop": [""]})", "stop"},
      {R"({"prompt": "a", "stream": "yes"})", "stream"},
      {R"({"prompt": "a", "stream_options": {"include_usage": true}})", "stream_options"},
      {R"({"prompt": "a", "logprobs": 100})", "logprobs"},
      {R"({"prompt": [1, 99999]})", "prompt[1]"},
      {R"({"prompt": {"x": 1}})", "prompt"},
      {R"({"prompt": "a", "seed": "x"})", "seed"},
      {R"({"prompt": "a", "kv": {"policy": "lru"}})", "kv.policy"},
      {R"({"prompt": "a", "kv": {"policy": "streaming", "budget": 4, "sinks": 4}})", "kv"},
      {R"({"prompt": "a", "kv": {"budget": 64}})", "kv.budget"},
      {R"({"prompt": "a", "kv": 3})", "kv"},
      {R"({"prompt": "a", "cache_salt": ""})", "cache_salt"},
      {R"({"prompt": "a", "cache_salt": 7})", "cache_salt"},
  };
  for (const auto& [body, param] : cases) {
    SCOPED_TRACE(body);
    expect_error_object(post_raw(c, "/v1/completions", body), 400, "invalid_request_error", param);
  }
  const std::pair<const char*, const char*> chat_cases[] = {
      {R"({"messages": []})", "messages"},
      {R"({"messages": "hi"})", "messages"},
      {R"({"messages": [{"content": "hi"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "wizard", "content": "hi"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", "messages[0].content[0].type"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2})", "top_logprobs"},
  };
  for (const auto& [body, param] : chat_cases) {
    SCOPED_TRACE(body);
    expect_error_object(post_raw(c, "/v1/chat/completions", body), 400, "invalid_request_error", param);
  }
  // Unknown fields are ignored, as OpenAI does.
  EXPECT_EQ(post_raw(c, "/v1/completions", R"({"prompt": "a", "max_tokens": 2, "frobnicate": true})").status, 200);
  ASSERT_TRUE(ts.wait_idle());
  EXPECT_EQ(ts.engine().leaked_blocks(), 0);
}

TEST(ServerErrors, PromptsBeyondTheContextOrThePoolAreContextLengthExceeded) {
  KVLM_REQUIRE_STORIES();
  TestServerOptions options;
  options.engine.num_blocks = 40;  // 640 tokens: less than the model's 2048-token context
  TestServer ts(options);
  auto c = ts.client();
  const int context = ts.model().config().context_length;
  std::vector<TokenId> too_long(static_cast<size_t>(context + 10), 300);
  expect_error_object(post_raw(c, "/v1/completions", json{{"prompt", too_long}}.dump()), 400,
                      "invalid_request_error", "prompt", "context_length_exceeded");
  std::vector<TokenId> over_pool(700, 300);
  expect_error_object(post_raw(c, "/v1/completions", json{{"prompt", over_pool}}.dump()), 400,
                      "invalid_request_error", "prompt", "context_length_exceeded");
  std::vector<TokenId> fits(100, 300);
  expect_error_object(post_raw(c, "/v1/completions", json{{"prompt", fits}, {"max_tokens", context}}.dump()), 400,
                      "invalid_request_error", "max_tokens", "context_length_exceeded");
  // Chat without max_tokens runs to what the pool holds, not into an error.
  EXPECT_EQ(post_raw(c, "/v1/completions", json{{"prompt", fits}, {"max_tokens", 4}}.dump()).status, 200);
  EXPECT_EQ(ts.engine().leaked_blocks(), 0);
}

TEST(ServerErrors, UnknownRouteAndModelAre404) {
  KVLM_REQUIRE_STORIES();
  TestServer ts;
  auto c = ts.client();
  auto res = c.Get("/v1/nothing");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
  EXPECT_EQ(json::parse(res->body)["error"]["type"], "not_found_error");
  expect_error_object(post_raw(c, "/v1/completions", R"({"model": "gpt-4", "prompt": "a"})"), 404,
                      "invalid_request_error", "model", "model_not_found");
}

TEST(ServerErrors, ApiKeyIsRequiredWhenSet) {
  KVLM_REQUIRE_STORIES();
  TestServerOptions options;
  options.server.api_key = "sk-test-123";
  TestServer ts(options);
  auto c = ts.client();
  const std::string body = R"({"prompt": "a", "max_tokens": 2})";
  expect_error_object(post_raw(c, "/v1/completions", body), 401, "authentication_error", "", "invalid_api_key");
  expect_error_object(post_raw(c, "/v1/completions", body, {{"Authorization", "Bearer sk-test-12"}}), 401,
                      "authentication_error");
  expect_error_object(post_raw(c, "/v1/completions", body, {{"Authorization", "Bearer sk-test-1234"}}), 401,
                      "authentication_error");
  EXPECT_EQ(post_raw(c, "/v1/completions", body, {{"Authorization", "Bearer sk-test-123"}}).status, 200);
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 401);
  auto health = c.Get("/health");  // probes need no key
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST(ServerErrors, BodyOverTheLimitIs413) {
  KVLM_REQUIRE_STORIES();
  TestServerOptions options;
  options.server.max_body_bytes = 4096;
  TestServer ts(options);
  auto c = ts.client();
  const std::string big = json{{"prompt", std::string(8000, 'a')}}.dump();
  auto res = c.Post("/v1/completions", big, "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 413);
  EXPECT_EQ(json::parse(res->body)["error"]["code"], "request_too_large");
}

TEST(ServerErrors, LoadingIs503AndHealthSaysSo) {
  KVLM_REQUIRE_STORIES();
  TestServerOptions options;
  options.attach = false;
  TestServer ts(options);
  auto c = ts.client();
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  EXPECT_EQ(json::parse(health->body)["status"], "loading");
  expect_error_object(post_raw(c, "/v1/completions", R"({"prompt": "a"})"), 503, "service_unavailable", "", "loading");
  ts.attach();
  EXPECT_EQ(c.Get("/health")->status, 200);
}

TEST(ServerErrors, AnUnusableChatTemplateIsA400ForChatOnly) {
  KVLM_REQUIRE_STORIES();
  TestServerOptions options;
  options.attach = false;
  TestServer ts(options);
  ts.attach_without_chat("1:4: unknown tag 'frobnicate'");
  auto c = ts.client();
  const ErrorReply r = post_raw(c, "/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}]})");
  expect_error_object(r, 400, "invalid_request_error", "messages", "chat_template_error");
  EXPECT_NE(r.error["message"].get<std::string>().find("unknown tag 'frobnicate'"), std::string::npos);
  EXPECT_EQ(post_raw(c, "/v1/completions", R"({"prompt": "a", "max_tokens": 2})").status, 200);
}

TEST(ServerErrors, FullQueueIs429WithRetryAfter) {
  KVLM_REQUIRE_STORIES();
  TestServerOptions options;
  options.engine.max_seqs = 1;
  options.server.max_queue = 0;
  TestServer ts(options);
  // One long streaming request holds the only slot.
  std::atomic<bool> started{false};
  std::thread holder([&] {
    auto c = ts.client();
    const json body = {{"prompt", "Once"}, {"max_tokens", 400}, {"ignore_eos", true}, {"stream", true}};
    c.Post("/v1/completions", httplib::Headers{}, body.dump(), "application/json");
    (void)started;
  });
  while (ts.server().requests_in_flight() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  auto c = ts.client();
  const ErrorReply r = post_raw(c, "/v1/completions", R"({"prompt": "a", "max_tokens": 2})");
  expect_error_object(r, 429, "rate_limit_error", "", "queue_full");
  EXPECT_EQ(r.retry_after, "1");
  holder.join();
  ASSERT_TRUE(ts.wait_idle());
  EXPECT_EQ(ts.engine().leaked_blocks(), 0);
}

}  // namespace
}  // namespace kvlm::testing
