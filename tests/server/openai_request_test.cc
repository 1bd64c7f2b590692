// parse_completion_request: OpenAI's defaults, every field read, extensions, and errors naming the field.
#include <gtest/gtest.h>

#include "server/api_error.h"
#include "server/openai_request.h"
#include "server/server_metrics.h"

namespace kvlm::server {
namespace {

using nlohmann::json;

CompletionRequest parse(const json& body, Endpoint endpoint = Endpoint::kCompletions) {
  return parse_completion_request(body, endpoint, 512, RequestLimits{});
}

std::string error_param(const json& body, Endpoint endpoint = Endpoint::kCompletions) {
  try {
    parse(body, endpoint);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    return e.param;
  }
  ADD_FAILURE() << "no error for " << body.dump();
  return {};
}

TEST(OpenAiRequest, DefaultsAreOpenAisNotKvlmRuns) {
  const CompletionRequest r = parse({{"prompt", "hi"}});
  EXPECT_EQ(r.prompt_text, "hi");
  EXPECT_FALSE(r.prompt_is_tokens);
  EXPECT_FLOAT_EQ(r.sampler.temperature, 1.0f);
  EXPECT_FLOAT_EQ(r.sampler.top_p, 1.0f);
  EXPECT_EQ(r.sampler.top_k, 0);
  EXPECT_FLOAT_EQ(r.sampler.min_p, 0.0f);
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_EQ(r.n, 1);
  EXPECT_FALSE(r.stream);
  EXPECT_EQ(r.logprobs, -1);
  EXPECT_EQ(r.eviction.policy, EvictionPolicy::kNone);
}

TEST(OpenAiRequest, ReadsEveryField) {
  const CompletionRequest r = parse({{"model", "m"}, {"prompt", {1, 2, 3}}, {"max_completion_tokens", 7},
                                     {"temperature", 0.5}, {"top_p", 0.9}, {"top_k", 20}, {"min_p", 0.1},
                                     {"seed", -3}, {"stop", "END"}, {"n", 2}, {"stream", true},
                                     {"stream_options", {{"include_usage", true}}}, {"logprobs", 2},
                                     {"ignore_eos", true}, {"cache_salt", "t1"},
                                     {"kv", {{"policy", "streaming"}, {"budget", 128}, {"sinks", 8}}}});
  EXPECT_EQ(r.model, "m");
  EXPECT_TRUE(r.prompt_is_tokens);
  EXPECT_EQ(r.prompt_tokens, (std::vector<TokenId>{1, 2, 3}));
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.sampler.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampler.top_p, 0.9f);
  EXPECT_EQ(r.sampler.top_k, 20);
  EXPECT_FLOAT_EQ(r.sampler.min_p, 0.1f);
  EXPECT_TRUE(r.has_seed);
  EXPECT_EQ(r.sampler.seed, static_cast<uint64_t>(int64_t{-3}));
  EXPECT_EQ(r.stop, (std::vector<std::string>{"END"}));
  EXPECT_EQ(r.n, 2);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.logprobs, 2);
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_EQ(r.cache_salt, "t1");
  EXPECT_EQ(r.eviction.policy, EvictionPolicy::kStreaming);
  EXPECT_EQ(r.eviction.budget, 128);
  EXPECT_EQ(r.eviction.sinks, 8);
}

TEST(OpenAiRequest, ChatMessagesAreNormalised) {
  const CompletionRequest r =
      parse({{"messages",
              {{{"role", "system"}, {"content", "be brief"}},
               {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}},
               {{"role", "assistant"}, {"content", nullptr}}}},
             {"logprobs", true},
             {"top_logprobs", 3}},
            Endpoint::kChat);
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[1]["content"], "ab");
  EXPECT_EQ(r.messages[2]["content"], "");
  EXPECT_EQ(r.logprobs, 3);
}

TEST(OpenAiRequest, NullMeansNotGivenAndUnknownFieldsAreIgnored) {
  const CompletionRequest r = parse({{"prompt", "x"}, {"temperature", nullptr}, {"whatever", {1, 2}}});
  EXPECT_FLOAT_EQ(r.sampler.temperature, 1.0f);
}

TEST(OpenAiRequest, ErrorsNameTheField) {
  EXPECT_EQ(error_param({{"prompt", "x"}, {"top_k", "many"}}), "top_k");
  EXPECT_EQ(error_param({{"prompt", "x"}, {"min_p", 2}}), "min_p");
  EXPECT_EQ(error_param({{"prompt", "x"}, {"model", 3}}), "model");
  EXPECT_EQ(error_param({{"prompt", "x"}, {"echo", true}}), "echo");
  EXPECT_EQ(error_param({{"prompt", {"a", "b"}}}), "prompt");
  EXPECT_EQ(error_param({{"prompt", {1, -1}}}), "prompt[1]");
  EXPECT_EQ(error_param({{"prompt", {1, 512}}}), "prompt[1]");
  EXPECT_EQ(error_param({{"prompt", "x"}, {"stop", {"a", 1}}}), "stop[1]");
  EXPECT_EQ(error_param({{"prompt", "x"}, {"kv", {{"policy", "h2o"}, {"budget", 0}}}}), "kv.budget");
  EXPECT_EQ(error_param({{"messages", {{{"role", "user"}}}}}, Endpoint::kChat), "messages[0].content");
  EXPECT_EQ(error_param({{"prompt", "x"}}, Endpoint::kChat), "messages");
  EXPECT_THROW(parse_json_body("{\"a\": "), ApiError);
  EXPECT_THROW(parse_json_body("42"), ApiError);
}

// Found by the openai_request fuzz target (fuzz/corpus/openai_request/regression_*): a number
// beyond double's range was a 500, 100,000 nested brackets overflowed the stack when copied.
TEST(OpenAiRequest, HostileJsonIsA400NotACrash) {
  const auto message_of = [](const std::string& body) -> std::string {
    try {
      parse_json_body(body);
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      return e.what();
    }
    ADD_FAILURE() << "no error";
    return {};
  };
  EXPECT_NE(message_of(R"({"prompt": "x", "temperature": 9E999999999999})").find("not valid JSON"), std::string::npos);
  const std::string deep = R"({"messages":[{"role":"user","content":"hi","x":)" + std::string(100000, '[') +
                           std::string(100000, ']') + "}]}";
  EXPECT_NE(message_of(deep).find("nests JSON more than 128 levels deep"), std::string::npos);
  // 128 levels still parse: real tool schemas nest far less.
  const std::string ok = "{\"a\":" + std::string(126, '[') + std::string(126, ']') + "}";
  EXPECT_NO_THROW(parse_json_body(ok));
}

TEST(ServerMetricsText, HistogramBucketsAreCumulativeAndEndInInf) {
  Histogram h({0.1, 1.0});
  h.observe(0.05);
  h.observe(0.1);  // on a bound: counted in that bucket (le)
  h.observe(0.5);
  h.observe(5.0);
  EXPECT_EQ(h.counts(), (std::vector<uint64_t>{2, 1, 1}));
  EXPECT_EQ(h.count(), 4u);
  EXPECT_DOUBLE_EQ(h.sum(), 5.65);

  ServerMetrics metrics;
  RequestStats stats;
  stats.completion_tokens = 3;
  stats.time_to_first_token = 0.2;
  stats.inter_token = {0.01, 0.02};
  stats.total_seconds = 0.25;
  metrics.record(RequestOutcome{FinishReason::kStop, &stats, EvictionPolicy::kNone});
  EngineMetrics e;
  e.blocks_total = 10;
  e.blocks_used = 4;
  e.bytes_per_block = 100;
  const std::string text = metrics.prometheus_text(e, MetricsLabels{"m\"x", "int8", "f16"});
  EXPECT_NE(text.find("kvlm:kv_cache_usage_ratio{model_name=\"m\\\"x\"} 0.4\n"), std::string::npos) << text;
  EXPECT_NE(text.find("kvlm:kv_cache_bytes{model_name=\"m\\\"x\",k_codec=\"int8\",v_codec=\"f16\",state=\"used\"} 400"),
            std::string::npos);
  EXPECT_NE(text.find("kvlm:request_success_total{model_name=\"m\\\"x\",finished_reason=\"stop\"} 1"), std::string::npos);
  EXPECT_NE(text.find("kvlm:time_to_first_token_seconds_bucket{model_name=\"m\\\"x\",le=\"0.25\"} 1"),
            std::string::npos);
  EXPECT_NE(text.find("kvlm:time_to_first_token_seconds_bucket{model_name=\"m\\\"x\",le=\"0.1\"} 0"),
            std::string::npos);
  EXPECT_NE(text.find("kvlm:inter_token_latency_seconds_count{model_name=\"m\\\"x\"} 2"), std::string::npos);
  EXPECT_NE(text.find("# TYPE kvlm:e2e_request_latency_seconds histogram"), std::string::npos);
  // Without sliding-window layers there are no local slots to report.
  EXPECT_EQ(text.find("kv_cache_local_slots"), std::string::npos);
  e.local_slots_total = 12;
  e.local_slots_pinned = 5;
  e.local_slots_retained = 4;
  e.local_bytes_per_slot = 10;
  const std::string local = metrics.prometheus_text(e, MetricsLabels{"m", "int8", "f16"});
  EXPECT_NE(local.find("kvlm:kv_cache_local_slots{model_name=\"m\",k_codec=\"int8\",v_codec=\"f16\",state=\"pinned\"} 5"),
            std::string::npos) << local;
  EXPECT_NE(local.find("kvlm:kv_cache_local_slots{model_name=\"m\",k_codec=\"int8\",v_codec=\"f16\",state=\"free\"} 3"),
            std::string::npos);
  EXPECT_NE(local.find("kvlm:kv_cache_local_bytes{model_name=\"m\",k_codec=\"int8\",v_codec=\"f16\",state=\"retained\"} 40"),
            std::string::npos);
}

}  // namespace
}  // namespace kvlm::server
