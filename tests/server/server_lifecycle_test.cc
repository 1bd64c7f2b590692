// Disconnects cancel and free, /metrics moves as requests run, and drain() ends what is left.
#include <atomic>
#include <regex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "server_test_util.h"

namespace kvlm::testing {
namespace {

using nlohmann::json;

// The value of one series in a /metrics body ("name{labels}" exactly), or -1 when absent.
double metric_value(const std::string& body, const std::string& series) {
  const size_t at = body.find(series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(body.substr(at + series.size() + 1));
}

std::string metrics_body(TestServer& ts) {
  auto c = ts.client();
  auto res = c.Get("/metrics");
  EXPECT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  return res ? res->body : std::string();
}

TEST(ServerLifecycle, ClientThatDisconnectsMidStreamIsCancelledAndItsBlocksGoBack) {
  KVLM_REQUIRE_STORIES();
  TestServer ts;
  const int64_t generated_before = ts.engine().metrics().tokens_generated;
  {
    auto c = ts.client();
    int chunks = 0;
    const json body = {{"prompt", "Once upon a time"}, {"max_tokens", 1500}, {"ignore_eos", true}, {"stream", true}};
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 4; };
    auto res = c.send(req);  // the receiver's false closes the connection
    EXPECT_GE(chunks, 4);
  }
  ASSERT_TRUE(ts.wait_idle()) << "the request kept running after its client left";
  const EngineMetrics m = ts.engine().metrics();
  EXPECT_EQ(m.blocks_used, 0);
  EXPECT_EQ(ts.engine().leaked_blocks(), 0);
  EXPECT_LT(m.tokens_generated - generated_before, 1500) << "cancelled long before its max_tokens";
  EXPECT_GE(metric_value(metrics_body(ts), "kvlm:request_success_total{model_name=\"stories260K\",finished_reason=\"abort\"}"), 1);
}

// Many streams at once whose clients close the socket mid-stream (after a few chunks, or before
// the first), beside clients that read to the end: every cancelled request gives its blocks
// back, the others complete, and the server still answers.
TEST(ServerLifecycle, ManyClientsDisconnectingMidStreamAtOnceLeakNothing) {
  KVLM_REQUIRE_STORIES();
  TestServer ts;
  constexpr int kLeavers = 12;
  constexpr int kStayers = 4;
  std::atomic<int> left_early{0};
  std::atomic<int> completed{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < kLeavers; ++i) {
    clients.emplace_back([&, i] {
      auto c = ts.client();
      if (i % 4 == 3) c.set_read_timeout(0, 30 * 1000);  // gives up before the first chunk
      const bool chat = i % 2 == 1;
      json body = {{"max_tokens", 1500}, {"ignore_eos", true}, {"stream", true}};
      if (chat) {
        body["messages"] = {{{"role", "user"}, {"content", "Tell me a story"}}};
      } else {
        body["prompt"] = "Once upon a time";
      }
      httplib::Request req;
      req.method = "POST";
      req.path = chat ? "/v1/chat/completions" : "/v1/completions";
      req.body = body.dump();
      req.set_header("Content-Type", "application/json");
      int chunks = 0;
      const int leave_after = 1 + i % 5;
      req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < leave_after; };
      c.send(req);
      ++left_early;
    });
  }
  for (int i = 0; i < kStayers; ++i) {
    clients.emplace_back([&] {
      auto c = ts.client();
      auto res = c.Post("/v1/completions", json{{"prompt", "Once"}, {"max_tokens", 8}, {"stream", true}}.dump(),
                        "application/json");
      if (res && res->status == 200 && res->body.find("data: [DONE]") != std::string::npos) ++completed;
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(left_early.load(), kLeavers);
  EXPECT_EQ(completed.load(), kStayers);
  ASSERT_TRUE(ts.wait_idle()) << "a request kept running after its client left";
  EXPECT_EQ(ts.engine().metrics().blocks_used, 0);
  EXPECT_EQ(ts.engine().leaked_blocks(), 0);
  auto c = ts.client();
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  auto res = c.Post("/v1/completions", R"({"prompt": "Once upon a time", "max_tokens": 4})", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
}

TEST(ServerLifecycle, ClientThatGivesUpWaitingIsCancelledToo) {
  KVLM_REQUIRE_STORIES();
  TestServer ts;
  const int64_t generated_before = ts.engine().metrics().tokens_generated;
  {
    auto c = ts.client();
    c.set_read_timeout(0, 150 * 1000);  // gives up after 150 ms, before the answer is ready
    const json body = {{"prompt", "Once upon a time"}, {"max_tokens", 1500}, {"ignore_eos", true}};
    auto res = c.Post("/v1/completions", body.dump(), "application/json");
    EXPECT_FALSE(res) << "expected the client to time out";
  }
  ASSERT_TRUE(ts.wait_idle());
  EXPECT_EQ(ts.engine().leaked_blocks(), 0);
  EXPECT_EQ(ts.engine().metrics().blocks_used, 0);
  EXPECT_LT(ts.engine().metrics().tokens_generated - generated_before, 1500);
}

TEST(ServerLifecycle, MetricsMoveAsRequestsRun) {
  KVLM_REQUIRE_STORIES();
  TestServer ts;
  const std::string before = metrics_body(ts);
  const std::string labels = "{model_name=\"stories260K\"}";
  EXPECT_EQ(metric_value(before, "kvlm:num_requests_running" + labels), 0);
  EXPECT_EQ(metric_value(before, "kvlm:generation_tokens_total" + labels), 0);
  for (const char* name : {"kvlm:num_requests_waiting", "kvlm:kv_cache_usage_ratio", "kvlm:prefix_cache_queries_total",
                           "kvlm:prefix_cache_hits_total", "kvlm:num_preemptions_total", "kvlm:prompt_tokens_total"}) {
    EXPECT_GE(metric_value(before, name + labels), 0) << name;
  }
  EXPECT_NE(before.find("# TYPE kvlm:time_to_first_token_seconds histogram"), std::string::npos);
  EXPECT_NE(before.find("kvlm:kv_cache_blocks{model_name=\"stories260K\",k_codec=\"f32\",v_codec=\"f32\",state=\"free\"} 256"),
            std::string::npos)
      << before;

  auto c = ts.client();
  const json body = {{"prompt", "Once upon a time"}, {"max_tokens", 10}, {"temperature", 0}, {"ignore_eos", true}};
  post_json(c, "/v1/completions", body);
  post_json(c, "/v1/completions", body);
  // The gauges are refreshed after the step that ends a request, which may be just after its
  // client has the last token: wait for that step before reading them.
  ASSERT_TRUE(ts.wait_idle());
  const std::string after = metrics_body(ts);
  EXPECT_EQ(metric_value(after, "kvlm:generation_tokens_total" + labels), 20);
  EXPECT_EQ(metric_value(after, "kvlm:request_success_total{model_name=\"stories260K\",finished_reason=\"length\"}"), 2);
  EXPECT_EQ(metric_value(after, "kvlm:time_to_first_token_seconds_count" + labels), 2);
  EXPECT_EQ(metric_value(after, "kvlm:inter_token_latency_seconds_count" + labels), 18);
  EXPECT_EQ(metric_value(after, "kvlm:e2e_request_latency_seconds_count" + labels), 2);
  EXPECT_GT(metric_value(after, "kvlm:prompt_tokens_total" + labels), 0);
  EXPECT_GT(metric_value(after, "kvlm:prefix_cache_queries_total" + labels), 0);
  EXPECT_EQ(metric_value(after, "kvlm:num_requests_running" + labels), 0);
  // Published prompt blocks stay as cached-free blocks after the requests end.
  EXPECT_EQ(metric_value(after, "kvlm:kv_cache_blocks{model_name=\"stories260K\",k_codec=\"f32\",v_codec=\"f32\",state=\"used\"}"), 0);
  // Cumulative buckets end at the count.
  EXPECT_EQ(metric_value(after, "kvlm:time_to_first_token_seconds_bucket{model_name=\"stories260K\",le=\"+Inf\"}"), 2);
}

TEST(ServerLifecycle, DrainFinishesOrCancelsInFlightStreamsAndRefusesNewOnes) {
  KVLM_REQUIRE_STORIES();
  auto ts = std::make_unique<TestServer>();
  std::string streamed;
  std::thread client([&] {
    auto c = ts->client();
    const json body = {{"prompt", "Once"}, {"max_tokens", 1800}, {"ignore_eos", true}, {"stream", true}};
    auto res = c.Post("/v1/completions", body.dump(), "application/json");
    if (res) streamed = res->body;
  });
  while (ts->server().requests_in_flight() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const int cancelled = ts->server().drain(0.1);
  client.join();
  EXPECT_EQ(cancelled, 1);
  const auto events = sse_data(streamed);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  const json error = json::parse(events[events.size() - 2]);
  ASSERT_TRUE(error.contains("error")) << events[events.size() - 2];
  EXPECT_EQ(error["error"]["code"], "shutting_down");
  ASSERT_TRUE(ts->wait_idle());
  EXPECT_EQ(ts->engine().leaked_blocks(), 0);
}

TEST(ServerLifecycle, RequestTimeoutEndsAStreamWithAnErrorAndAWholeResponseLikeMaxTokens) {
  KVLM_REQUIRE_STORIES();
  TestServerOptions options;
  options.server.request_timeout_seconds = 0.05;
  TestServer ts(options);
  auto c = ts.client();
  int status = 0;
  const json body = {{"prompt", "Once"}, {"max_tokens", 1900}, {"ignore_eos", true}};
  const json whole = post_json(c, "/v1/completions", body, &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "length") << whole.dump();
  EXPECT_LT(whole["usage"]["completion_tokens"].get<int>(), 1900);
  json streamed = body;
  streamed["stream"] = true;
  auto res = c.Post("/v1/completions", streamed.dump(), "application/json");
  ASSERT_TRUE(res);
  const auto events = sse_data(res->body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  const json error = json::parse(events[events.size() - 2]);
  ASSERT_TRUE(error.contains("error")) << events[events.size() - 2];
  EXPECT_EQ(error["error"]["code"], "timeout");
  ASSERT_TRUE(ts.wait_idle());
  EXPECT_EQ(ts.engine().leaked_blocks(), 0);
}

}  // namespace
}  // namespace kvlm::testing
