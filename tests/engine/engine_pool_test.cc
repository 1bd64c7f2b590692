// Pool accounting through the engine: after every way a request can end (finished, cancelled in
// prefill or decode, preempted and resumed, rejected) every block is free or cached-free with
// reference count 0; a randomized run of thousands of submit / step / cancel operations keeps
// the cache's invariants after every step. Also submission errors and stop conditions.
#include <gtest/gtest.h>

#include <map>

#include "engine/engine_test_util.h"

namespace kvlm {
namespace {

using testing::collect_into;
using testing::random_prompt;
using testing::RequestOutput;

RequestOptions greedy(std::vector<TokenId> prompt, int max_tokens) {
  return testing::greedy_request(std::move(prompt), max_tokens);
}

class EnginePoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = &testing::tiny_engine_model("tiny-mha");
    options_ = testing::small_pool_options();
  }
  LlamaModel* model_ = nullptr;
  ThreadPool pool_{2};
  EngineOptions options_;
};

TEST_F(EnginePoolTest, CancelledInPrefillAndInDecodeGiveEveryBlockBack) {
  auto engine = Engine::create(*model_, pool_, options_).value();
  RequestOutput in_prefill, in_decode;
  const RequestId a = engine->submit(greedy(random_prompt(100, 512, 1), 20), collect_into(in_prefill)).value();
  const RequestId b = engine->submit(greedy(random_prompt(10, 512, 2), 50), collect_into(in_decode)).value();
  engine->step();  // a: its first chunk of 32 tokens; b: waits (budget spent)
  engine->step();
  EXPECT_GT(engine->cache().num_used_blocks(), 0);
  EXPECT_TRUE(engine->cancel(a));
  for (int i = 0; i < 8; ++i) engine->step();
  EXPECT_GT(in_decode.tokens.size(), 0u);
  EXPECT_TRUE(engine->cancel(b));
  engine->run_until_idle();
  EXPECT_EQ(in_prefill.finish, FinishReason::kCancelled);
  EXPECT_EQ(in_prefill.tokens.size(), 0u);
  EXPECT_EQ(in_decode.finish, FinishReason::kCancelled);
  EXPECT_EQ(engine->metrics().requests_cancelled, 2);
  testing::expect_every_block_back(*engine);
}

TEST_F(EnginePoolTest, RejectedAtSubmissionWithAClearError) {
  EngineOptions options = options_;
  options.num_blocks = 32;
  auto engine = Engine::create(*model_, pool_, options).value();
  auto too_big = engine->submit(greedy(random_prompt(100, 512, 3), 100), {});  // 50 blocks > 32
  ASSERT_FALSE(too_big.ok());
  EXPECT_NE(too_big.status().message().find("pool has only 32"), std::string::npos) << too_big.status().message();
  auto empty = engine->submit(greedy({}, 4), {});
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("empty"), std::string::npos);
  auto outside = engine->submit(greedy({1, 2, 9999}, 4), {});
  ASSERT_FALSE(outside.ok());
  EXPECT_NE(outside.status().message().find("9999"), std::string::npos);
  auto past_context = engine->submit(greedy(random_prompt(300, 512, 4), 1), {});  // context 256
  ASSERT_FALSE(past_context.ok());
  EXPECT_NE(past_context.status().message().find("context"), std::string::npos);
  RequestOptions bad_policy = greedy(random_prompt(10, 512, 5), 4);
  bad_policy.eviction.policy = EvictionPolicy::kStreaming;
  bad_policy.eviction.budget = 2;  // sinks 4 >= budget
  EXPECT_FALSE(engine->submit(bad_policy, {}).ok());
  EXPECT_EQ(engine->metrics().requests_rejected, 5);
  EXPECT_EQ(engine->metrics().requests_submitted, 0);
  testing::expect_every_block_back(*engine);
}

TEST_F(EnginePoolTest, StopTokensAndStopStringsEndTheRequest) {
  auto engine = Engine::create(*model_, pool_, options_).value();
  const std::vector<TokenId> prompt = random_prompt(12, 512, 8);
  RequestOutput free_run;
  ASSERT_TRUE(engine->submit(greedy(prompt, 12), collect_into(free_run)).ok());
  engine->run_until_idle();
  ASSERT_EQ(free_run.tokens.size(), 12u);

  RequestOutput by_token;
  RequestOptions r = greedy(prompt, 12);
  r.stop_tokens = {free_run.tokens[5]};
  ASSERT_TRUE(engine->submit(r, collect_into(by_token)).ok());
  engine->run_until_idle();
  EXPECT_EQ(by_token.finish, FinishReason::kStop);
  const auto first = std::find(free_run.tokens.begin(), free_run.tokens.end(), free_run.tokens[5]);
  EXPECT_EQ(by_token.tokens, std::vector<TokenId>(free_run.tokens.begin(), first));

  // A stop string cut out of the middle of the free-running text: the text stops right before it.
  const std::string& text = free_run.text;
  if (text.size() >= 6) {
    const std::string stop = text.substr(text.size() / 2, 2);
    RequestOutput by_string;
    RequestOptions s = greedy(prompt, 12);
    s.stop_strings = {stop};
    ASSERT_TRUE(engine->submit(s, collect_into(by_string)).ok());
    engine->run_until_idle();
    EXPECT_EQ(by_string.finish, FinishReason::kStop);
    EXPECT_EQ(by_string.text, text.substr(0, text.find(stop)));
  }
  testing::expect_every_block_back(*engine);
}

TEST_F(EnginePoolTest, ALongPromptNeverStallsTheDecodes) {
  // Budget 32 per step; a 200-token prompt arrives while two requests decode: they still get a
  // token every step (decode tokens are scheduled before prompt chunks), and the prompt advances
  // by what is left of the budget.
  auto engine = Engine::create(*model_, pool_, options_).value();
  RequestOutput a, b, long_prompt;
  ASSERT_TRUE(engine->submit(greedy(random_prompt(5, 512, 11), 40), collect_into(a)).ok());
  ASSERT_TRUE(engine->submit(greedy(random_prompt(6, 512, 12), 40), collect_into(b)).ok());
  engine->step();  // both prompts, first tokens
  RequestOptions urgent = greedy(random_prompt(200, 512, 13), 2);
  urgent.priority = 1;  // ranks first, and still waits for the decodes' tokens
  ASSERT_TRUE(engine->submit(urgent, collect_into(long_prompt)).ok());
  for (int s = 0; s < 8; ++s) {
    const size_t before_a = a.tokens.size(), before_b = b.tokens.size();
    engine->step();
    EXPECT_EQ(a.tokens.size(), before_a + 1) << "step " << s;
    EXPECT_EQ(b.tokens.size(), before_b + 1) << "step " << s;
  }
  engine->run_until_idle();
  EXPECT_EQ(long_prompt.finish, FinishReason::kLength);
  testing::expect_every_block_back(*engine);
}

// A pool model: which requests exist and what each must end as; the engine's cache is checked
// after every step, and every request gets exactly one final event.
TEST_F(EnginePoolTest, RandomizedSubmitStepCancelKeepsThePoolExact) {
  EngineOptions options = options_;
  options.num_blocks = 40;  // small enough to preempt often
  options.max_batch_tokens = 24;
  options.max_seqs = 6;
  auto engine = Engine::create(*model_, pool_, options).value();
  Rng rng(2024);
  const std::vector<TokenId> shared = random_prompt(40, 512, 9);
  std::map<int32_t, RequestOutput> outputs;
  std::map<int32_t, RequestOptions> submitted;
  std::vector<RequestId> ids;
  int rejected = 0;
  for (int op = 0; op < 3000; ++op) {
    const uint64_t kind = rng.next_u64() % 10;
    if (kind < 3) {
      const int len = 1 + static_cast<int>(rng.next_u64() % 60);
      std::vector<TokenId> prompt = random_prompt(len, 512, rng.next_u64());
      if (rng.next_u64() % 2 == 0) prompt.insert(prompt.begin(), shared.begin(), shared.begin() + 20 + len % 20);
      RequestOptions r = greedy(prompt, 1 + static_cast<int>(rng.next_u64() % 40));
      if (rng.next_u64() % 4 == 0) {
        r.eviction.policy = EvictionPolicy::kStreaming;
        r.eviction.budget = 24;
        r.eviction.sinks = 2;
      } else if (rng.next_u64() % 6 == 0) {
        r.eviction.policy = EvictionPolicy::kH2o;
        r.eviction.budget = 24;
      }
      r.priority = static_cast<int>(rng.next_u64() % 3);
      // Ids count accepted requests only, so the next one is known before submitting.
      const int32_t next_key = static_cast<int32_t>(ids.size());
      auto id = engine->submit(r, collect_into(outputs[next_key]));
      if (!id.ok()) {
        outputs.erase(next_key);
        ++rejected;
        continue;
      }
      ASSERT_EQ(id->value, next_key);
      submitted[id->value] = r;
      ids.push_back(*id);
    } else if (kind < 4 && !ids.empty()) {
      engine->cancel(ids[rng.next_u64() % ids.size()]);
    } else {
      engine->step();
      engine->cache().check_invariants();
      ASSERT_EQ(engine->leaked_blocks(), 0) << "after op " << op;
    }
  }
  engine->run_until_idle();
  testing::expect_every_block_back(*engine);
  EXPECT_GT(engine->metrics().preemptions, 0);
  for (const auto& [id, out] : outputs) {
    EXPECT_NE(out.finish, FinishReason::kNone) << "request " << id << " never finished";
    EXPECT_NE(out.finish, FinishReason::kError) << "request " << id << ": " << out.error;
    if (out.finish == FinishReason::kLength) {
      EXPECT_EQ(static_cast<int>(out.tokens.size()), submitted[id].max_tokens) << "request " << id;
    }
  }
}

}  // namespace
}  // namespace kvlm
