// The OpenAI endpoints end to end over HTTP: completions and chat, streaming and not, stop
// strings, n > 1, usage with cached tokens, logprobs, tokenize.
#include <cmath>
#include <future>
#include <set>

#include <gtest/gtest.h>

#include "model/tokenizer.h"
#include "server_test_util.h"

namespace kvlm::testing {
namespace {

using nlohmann::json;

// The greedy continuation of `prompt`, straight from the engine (no HTTP, no server code).
std::string engine_greedy_text(TestServer& ts, const std::string& prompt, int max_tokens) {
  RequestOptions r;
  r.prompt = ts.model().tokenizer().encode(prompt, ts.model().tokenizer().add_bos());
  r.max_tokens = max_tokens;
  r.sampler.temperature = 0;
  auto text = std::make_shared<std::string>();
  auto done = std::make_shared<std::promise<void>>();
  auto id = ts.engine().submit(r, [text, done](const TokenEvent& e) {
    *text += e.text;
    if (e.finish != FinishReason::kNone) done->set_value();
  });
  EXPECT_TRUE(id.ok());
  done->get_future().wait();
  return *text;
}

TEST(ServerApi, HealthModelsAndNotFound) {
  KVLM_REQUIRE_STORIES();
  TestServer ts;
  auto c = ts.client();
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(json::parse(health->body)["status"], "ok");
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200);
  const json m = json::parse(models->body);
  EXPECT_EQ(m["object"], "list");
  ASSERT_EQ(m["data"].size(), 1u);
  EXPECT_EQ(m["data"][0]["id"], "stories260K");
  EXPECT_EQ(m["data"][0]["object"], "model");
}

TEST(ServerApi, CompletionGreedyMatchesTheEngine) {
  KVLM_REQUIRE_STORIES();
  TestServer ts;
  auto c = ts.client();
  int status = 0;
  const json r = post_json(c, "/v1/completions",
                           {{"model", "stories260K"}, {"prompt", "Once upon a time"}, {"max_tokens", 40},
                            {"temperature", 0}},
                           &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["model"], "stories260K");
  EXPECT_EQ(r["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  ASSERT_EQ(r["choices"].size(), 1u);
  const std::string text = r["choices"][0]["text"];
  EXPECT_EQ(text, engine_greedy_text(ts, "Once upon a time", 40));
  EXPECT_NE(text.find("there was"), std::string::npos) << text;  // real English from stories260K
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  const json& u = r["usage"];
  const int prompt_tokens = static_cast<int>(ts.model().tokenizer().encode("Once upon a time", true).size());
  EXPECT_EQ(u["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(u["completion_tokens"], 40);
  EXPECT_EQ(u["total_tokens"], prompt_tokens + 40);
  EXPECT_TRUE(u["prompt_tokens_details"].contains("cached_tokens"));
  EXPECT_EQ(ts.engine().leaked_blocks(), 0);
}

TEST(ServerApi, CompletionDefaultsToSixteenTokensAndAcceptsTokenPrompts) {
  KVLM_REQUIRE_STORIES();
  TestServer ts;
  auto c = ts.client();
  const std::vector<TokenId> ids = ts.model().tokenizer().encode("The dog", true);
  int status = 0;
  const json r = post_json(c, "/v1/completions", {{"prompt", ids}, {"temperature", 0}, {"ignore_eos", true}}, &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["usage"]["completion_tokens"], 16);  // OpenAI's default max_tokens for completions
  EXPECT_EQ(r["usage"]["prompt_tokens"], static_cast<int>(ids.size()));
  EXPECT_EQ(r["choices"][0]["text"], engine_greedy_text(ts, "The dog", 16));
}

TEST(ServerApi, StreamedCompletionEqualsTheWholeOne) {
  KVLM_REQUIRE_STORIES();
  TestServer ts;
  auto c = ts.client();
  const json body = {{"prompt", "Lily went to the park"}, {"max_tokens", 30}, {"temperature", 0}};
  const json whole = post_json(c, "/v1/completions", body);
  json streamed_body = body;
  streamed_body["stream"] = true;
  auto res = c.Post("/v1/completions", streamed_body.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_NE(res->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  const auto events = sse_data(res->body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  std::set<std::string> ids;
  std::set<int64_t> created;
  int finishes = 0;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json chunk = json::parse(events[i]);
    EXPECT_EQ(chunk["object"], "text_completion");
    ids.insert(chunk["id"].get<std::string>());
    created.insert(chunk["created"].get<int64_t>());
    ASSERT_EQ(chunk["choices"].size(), 1u);
    text += chunk["choices"][0]["text"].get<std::string>();
    if (!chunk["choices"][0]["finish_reason"].is_null()) {
      ++finishes;
      EXPECT_EQ(i + 2, events.size()) << "the finish chunk is the last before [DONE]";
      EXPECT_EQ(chunk["choices"][0]["finish_reason"], "length");
    }
    EXPECT_FALSE(chunk.contains("usage")) << "usage only with stream_options.include_usage";
  }
  EXPECT_EQ(ids.size(), 1u);
  EXPECT_EQ(created.size(), 1u);
  EXPECT_EQ(finishes, 1);
  EXPECT_EQ(text, whole["choices"][0]["text"]);
}

TEST(ServerApi, StreamedChatHasRoleDeltasFinishAndUsageChunk) {
  KVLM_REQUIRE_STORIES();
  TestServer ts;
  auto c = ts.client();
  const json body = {{"messages", {{{"role", "user"}, {"content", "Tell me a story."}}}},
                     {"max_tokens", 24},
                     {"temperature", 0},
                     {"stream", true},
                     {"stream_options", {{"include_usage", true}}}};
  auto res = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const auto events = sse_data(res->body);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.back(), "[DONE]");
  const json first = json::parse(events.front());
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  const json usage_chunk = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage_chunk["choices"].empty());
  EXPECT_EQ(usage_chunk["usage"]["completion_tokens"], 24);
  EXPECT_GT(usage_chunk["usage"]["prompt_tokens"].get<int>(), 5);
  const json last_choice = json::parse(events[events.size() - 3]);
  EXPECT_EQ(last_choice["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(last_choice["choices"][0]["delta"].empty());
  std::string content;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    const json chunk = json::parse(events[i]);
    EXPECT_EQ(chunk["id"], first["id"]);
    EXPECT_EQ(chunk["created"], first["created"]);
    EXPECT_TRUE(chunk.contains("usage") && chunk["usage"].is_null()) << "include_usage: null on every chunk";
    if (chunk["choices"][0]["delta"].contains("content")) content += chunk["choices"][0]["delta"]["content"];
  }
  const json whole = post_json(c, "/v1/chat/completions",
                               {{"messages", body["messages"]}, {"max_tokens", 24}, {"temperature", 0}});
  EXPECT_EQ(whole["object"], "chat.completion");
  EXPECT_EQ(whole["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(whole["choices"][0]["message"]["content"], content);
}

TEST(ServerApi, StopStringAcrossTokenBoundariesIsCutAndNotIncluded) {
  KVLM_REQUIRE_STORIES();
  TestServer ts;
  auto c = ts.client();
  const std::string full = engine_greedy_text(ts, "Once upon a time", 60);
  // A stop string that starts inside one token and ends in a later one.
  const Tokenizer& tok = ts.model().tokenizer();
  const std::vector<TokenId> ids = tok.encode("Once upon a time", true);
  RequestOptions probe;
  std::string stop;
  size_t cut = std::string::npos;
  {
    // Pieces of the greedy output: pick two consecutive pieces and straddle their boundary.
    std::vector<std::string> pieces;
    RequestOptions r;
    r.prompt = ids;
    r.max_tokens = 60;
    r.sampler.temperature = 0;
    auto done = std::make_shared<std::promise<void>>();
    auto out = std::make_shared<std::vector<std::string>>();
    ASSERT_TRUE(ts.engine().submit(r, [out, done](const TokenEvent& e) {
      out->push_back(e.text);
      if (e.finish != FinishReason::kNone) done->set_value();
    }).ok());
    done->get_future().wait();
    pieces = *out;
    size_t offset = 0;
    for (size_t i = 5; i + 1 < pieces.size(); ++i) {
      offset = 0;
      for (size_t j = 0; j < i; ++j) offset += pieces[j].size();
      if (pieces[i].size() >= 2 && pieces[i + 1].size() >= 2) {
        stop = pieces[i].substr(pieces[i].size() - 2) + pieces[i + 1].substr(0, 2);
        cut = full.find(stop);
        break;
      }
    }
  }
  ASSERT_FALSE(stop.empty());
  ASSERT_NE(cut, std::string::npos);
  for (bool stream : {false, true}) {
    const json body = {{"prompt", "Once upon a time"}, {"max_tokens", 60}, {"temperature", 0}, {"stop", {stop}},
                       {"stream", stream}};
    auto res = c.Post("/v1/completions", body.dump(), "application/json");
    ASSERT_TRUE(res);
    std::string text;
    std::string finish;
    if (stream) {
      for (const std::string& e : sse_data(res->body)) {
        if (e == "[DONE]") continue;
        const json chunk = json::parse(e);
        text += chunk["choices"][0]["text"].get<std::string>();
        if (!chunk["choices"][0]["finish_reason"].is_null()) finish = chunk["choices"][0]["finish_reason"];
      }
    } else {
      const json r = json::parse(res->body);
      text = r["choices"][0]["text"];
      finish = r["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(text, full.substr(0, cut)) << "stop '" << stop << "' stream=" << stream;
    EXPECT_EQ(finish, "stop");
  }
}

TEST(ServerApi, ParallelSamplesShareThePromptBlocks) {
  KVLM_REQUIRE_STORIES();
  TestServer ts;
  auto c = ts.client();
  std::string prompt;
  for (int i = 0; i < 8; ++i) prompt += "The little cat played with a ball in the garden. ";
  const int64_t hits_before = ts.engine().metrics().prefix_hit_tokens;
  int status = 0;
  const json r = post_json(c, "/v1/completions",
                           {{"prompt", prompt}, {"max_tokens", 12}, {"n", 3}, {"seed", 5}, {"temperature", 1.0},
                            {"ignore_eos", true}},
                           &status);
  ASSERT_EQ(status, 200) << r.dump();
  ASSERT_EQ(r["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(r["choices"][i]["index"], i);
  EXPECT_EQ(r["usage"]["completion_tokens"], 36);
  const int prompt_tokens = r["usage"]["prompt_tokens"];
  // Choices 1 and 2 attach choice 0's full prompt blocks from the prefix cache.
  const int full_blocks_tokens = (prompt_tokens / 16) * 16;
  const int64_t hits = ts.engine().metrics().prefix_hit_tokens - hits_before;
  EXPECT_GE(hits, 2 * (full_blocks_tokens - 16)) << "prompt " << prompt_tokens << " tokens";
  // Each choice draws with its own seed (seed + index): not all three identical.
  std::set<std::string> texts;
  for (const auto& ch : r["choices"]) texts.insert(ch["text"].get<std::string>());
  EXPECT_GT(texts.size(), 1u);
  // The same seed gives the same samples.
  const json again = post_json(c, "/v1/completions",
                               {{"prompt", prompt}, {"max_tokens", 12}, {"n", 3}, {"seed", 5}, {"temperature", 1.0},
                                {"ignore_eos", true}});
  for (int i = 0; i < 3; ++i) EXPECT_EQ(again["choices"][i]["text"], r["choices"][i]["text"]);
  ASSERT_TRUE(ts.wait_idle());
  EXPECT_EQ(ts.engine().leaked_blocks(), 0);
}

TEST(ServerApi, RepeatedPromptReportsItsCachedPrefix) {
  KVLM_REQUIRE_STORIES();
  TestServer ts;
  auto c = ts.client();
  std::string prompt;
  for (int i = 0; i < 6; ++i) prompt += "Tom and Sue went to the big park to play. ";
  const json body = {{"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}};
  const json first = post_json(c, "/v1/completions", body);
  EXPECT_EQ(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  const json second = post_json(c, "/v1/completions", body);
  const int prompt_tokens = second["usage"]["prompt_tokens"];
  const int cached = second["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GE(cached, (prompt_tokens - 1) / 16 * 16) << "whole blocks of the prompt are cached";
  EXPECT_LT(cached, prompt_tokens);
  EXPECT_EQ(second["choices"][0]["text"], first["choices"][0]["text"]);
  // Another tenant's salt never sees those blocks.
  json salted = body;
  salted["cache_salt"] = "tenant-b";
  const json other = post_json(c, "/v1/completions", salted);
  EXPECT_EQ(other["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(other["choices"][0]["text"], first["choices"][0]["text"]);
  const json other_again = post_json(c, "/v1/completions", salted);
  EXPECT_EQ(other_again["usage"]["prompt_tokens_details"]["cached_tokens"], cached);
}

TEST(ServerApi, CompletionLogprobsAreTheModelsDistribution) {
  KVLM_REQUIRE_STORIES();
  TestServer ts;
  auto c = ts.client();
  const json r = post_json(c, "/v1/completions",
                           {{"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}, {"logprobs", 3}});
  const json& lp = r["choices"][0]["logprobs"];
  ASSERT_TRUE(lp.is_object()) << r.dump();
  ASSERT_EQ(lp["tokens"].size(), 8u);
  ASSERT_EQ(lp["token_logprobs"].size(), 8u);
  ASSERT_EQ(lp["top_logprobs"].size(), 8u);
  std::string joined;
  for (size_t i = 0; i < 8; ++i) {
    const double sampled = lp["token_logprobs"][i];
    EXPECT_LE(sampled, 0.0);
    const json& top = lp["top_logprobs"][i];
    EXPECT_EQ(top.size(), 3u);
    double best = -INFINITY;
    for (const auto& [token, value] : top.items()) best = std::max(best, value.get<double>());
    EXPECT_NEAR(sampled, best, 1e-9) << "greedy picks the most likely token";
    EXPECT_EQ(lp["text_offset"][i], joined.size());
    joined += lp["tokens"][i].get<std::string>();
  }
  EXPECT_EQ(joined, r["choices"][0]["text"]);
  // Chat's shape: content[] with bytes and top_logprobs.
  const json chat = post_json(c, "/v1/chat/completions",
                              {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 4},
                               {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 2}});
  const json& content = chat["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 4u) << chat.dump();
  EXPECT_EQ(content[0]["top_logprobs"].size(), 2u);
  EXPECT_TRUE(content[0]["bytes"].is_array());
}

TEST(ServerApi, EvictionPolicyPerRequestRunsAndIsCounted) {
  KVLM_REQUIRE_STORIES();
  TestServer ts;
  auto c = ts.client();
  int status = 0;
  const json r = post_json(c, "/v1/completions",
                           {{"prompt", "Once upon a time"}, {"max_tokens", 200}, {"temperature", 0},
                            {"ignore_eos", true}, {"kv", {{"policy", "streaming"}, {"budget", 64}, {"sinks", 4}}}},
                           &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["usage"]["completion_tokens"], 200);
  auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  const std::string line = "kvlm:evicted_tokens_total{model_name=\"stories260K\",policy=\"streaming\"} ";
  const size_t at = metrics->body.find(line);
  ASSERT_NE(at, std::string::npos) << metrics->body;
  EXPECT_GT(std::stod(metrics->body.substr(at + line.size())), 100.0);
}

TEST(ServerApi, TokenizeAndDetokenizeRoundTrip) {
  KVLM_REQUIRE_STORIES();
  TestServer ts;
  auto c = ts.client();
  const json t = post_json(c, "/tokenize", {{"content", "Hello world"}});
  EXPECT_EQ(t["tokens"], json(ts.model().tokenizer().encode("Hello world", false)));
  const json with_bos = post_json(c, "/tokenize", {{"content", "Hello world"}, {"add_special", true}});
  EXPECT_EQ(with_bos["tokens"][0], ts.model().tokenizer().bos_id());
  const json pieces = post_json(c, "/tokenize", {{"content", "Hello"}, {"with_pieces", true}});
  ASSERT_TRUE(pieces["tokens"][0].contains("piece"));
  const json d = post_json(c, "/detokenize", {{"tokens", t["tokens"]}});
  EXPECT_EQ(d["content"], "Hello world");
}

}  // namespace
}  // namespace kvlm::testing
