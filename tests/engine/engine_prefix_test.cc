// Automatic prefix caching through the engine: what a hit saves (counted exactly), salts that
// never share, full hits, sharing between requests in flight, and outputs equal to no caching.
#include <gtest/gtest.h>

#include "engine/engine_test_util.h"

namespace kvlm {
namespace {

using testing::collect_into;
using testing::random_prompt;
using testing::RequestOutput;
using testing::run_alone;

class EnginePrefixTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = &testing::tiny_engine_model("tiny-gqa");
    options_.k_type = options_.v_type = KvType::kF32;
    options_.block_size = 16;
    options_.num_blocks = 256;
    options_.max_batch_tokens = 512;
    engine_ = Engine::create(*model_, pool_, options_).value();
    base_ = random_prompt(200, model_->config().vocab_size, 5);
  }

  RequestOptions request(std::vector<TokenId> prompt, int max_tokens, std::string salt = {}) {
    return testing::greedy_request(std::move(prompt), max_tokens, std::move(salt));
  }

  // Runs one request to the end; returns its output and the tokens the model computed for it.
  std::pair<RequestOutput, int64_t> run(const RequestOptions& r) {
    RequestOutput out;
    const int64_t before = engine_->metrics().tokens_computed;
    EXPECT_TRUE(engine_->submit(r, collect_into(out)).ok());
    engine_->run_until_idle();
    return {out, engine_->metrics().tokens_computed - before};
  }

  LlamaModel* model_ = nullptr;
  ThreadPool pool_{2};
  EngineOptions options_;
  std::unique_ptr<Engine> engine_;
  std::vector<TokenId> base_;
};

TEST_F(EnginePrefixTest, NinetyPercentSharedPrefixComputesOnlyTheRest) {
  auto [first, first_computed] = run(request(base_, 1));
  EXPECT_EQ(first_computed, 200);  // max_tokens 1: the sampled token is never forwarded
  EXPECT_EQ(first.stats.cached_prompt_tokens, 0);

  std::vector<TokenId> second_prompt(base_.begin(), base_.begin() + 180);  // 90% of 200
  const std::vector<TokenId> tail = random_prompt(20, model_->config().vocab_size, 6);
  second_prompt.insert(second_prompt.end(), tail.begin(), tail.end());
  const RequestOptions second = request(second_prompt, 8);
  auto [out, computed] = run(second);
  // 180 shared tokens fill 11 whole blocks of 16 = 176 cached tokens; 24 prompt tokens + 7 decodes computed.
  EXPECT_EQ(out.stats.cached_prompt_tokens, 176);
  EXPECT_EQ(computed, 24 + 7);
  const RequestOutput alone = run_alone(*model_, options_, second);
  EXPECT_EQ(out.tokens, alone.tokens);
  EXPECT_EQ(out.text, alone.text);
  EXPECT_EQ(engine_->leaked_blocks(), 0);
}

TEST_F(EnginePrefixTest, FullHitRecomputesTheLastBlockForItsLogits) {
  run(request(base_, 1));
  auto [out, computed] = run(request(base_, 1));
  // 200 = 12 blocks + 8; at most 199 tokens come from the cache: 12 blocks = 192.
  EXPECT_EQ(out.stats.cached_prompt_tokens, 192);
  EXPECT_EQ(computed, 8);
  std::vector<TokenId> exact(base_.begin(), base_.begin() + 192);  // a whole number of blocks
  auto [out2, computed2] = run(request(exact, 1));
  EXPECT_EQ(out2.stats.cached_prompt_tokens, 176);  // the last block is computed again
  EXPECT_EQ(computed2, 16);
}

TEST_F(EnginePrefixTest, SaltedRequestsNeverShare) {
  run(request(base_, 1, "tenant-a"));
  auto [other, other_computed] = run(request(base_, 1, "tenant-b"));
  EXPECT_EQ(other.stats.cached_prompt_tokens, 0);
  EXPECT_EQ(other_computed, 200);
  auto [unsalted, unsalted_computed] = run(request(base_, 1));
  EXPECT_EQ(unsalted.stats.cached_prompt_tokens, 0);
  auto [same, same_computed] = run(request(base_, 1, "tenant-a"));
  EXPECT_EQ(same.stats.cached_prompt_tokens, 192);
  EXPECT_EQ(same_computed, 8);
}

TEST_F(EnginePrefixTest, RequestsInFlightShareBlocksAsTheyFill) {
  // A small step budget: the first request's early blocks are published while it is still in
  // prefill, and the second, admitted later, finds them.
  EngineOptions options = options_;
  options.max_batch_tokens = 48;
  auto engine = Engine::create(*model_, pool_, options).value();
  RequestOutput a, b;
  ASSERT_TRUE(engine->submit(request(base_, 4), collect_into(a)).ok());
  engine->step();  // a: tokens [0, 48) computed, 3 blocks published
  ASSERT_TRUE(engine->submit(request(base_, 4), collect_into(b)).ok());
  engine->run_until_idle();
  EXPECT_GE(b.stats.cached_prompt_tokens, 48);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_GT(engine->metrics().prefix_hit_tokens, 0);
  EXPECT_EQ(engine->leaked_blocks(), 0);
  EXPECT_EQ(engine->cache().num_used_blocks(), 0);
}

TEST_F(EnginePrefixTest, DisabledPrefixCachingNeverHits) {
  EngineOptions options = options_;
  options.prefix_caching = false;
  auto engine = Engine::create(*model_, pool_, options).value();
  for (int i = 0; i < 2; ++i) {
    RequestOutput out;
    ASSERT_TRUE(engine->submit(request(base_, 1), collect_into(out)).ok());
    engine->run_until_idle();
    EXPECT_EQ(out.stats.cached_prompt_tokens, 0);
  }
  EXPECT_EQ(engine->metrics().blocks_published, 0);
}

TEST_F(EnginePrefixTest, CachedFreeBlocksAreReusedWhenThePoolNeedsThem) {
  // A pool of 20 blocks: the first prompt's 12 published blocks stay cached-free after it ends;
  // an unrelated prompt of 200 tokens needs 13 and takes the least recently used of them.
  EngineOptions options = options_;
  options.num_blocks = 20;
  auto engine = Engine::create(*model_, pool_, options).value();
  auto go = [&](const std::vector<TokenId>& prompt) {
    RequestOutput out;
    EXPECT_TRUE(engine->submit(request(prompt, 1), collect_into(out)).ok());
    engine->run_until_idle();
    return out;
  };
  go(base_);
  EXPECT_EQ(engine->metrics().blocks_cached_free, 12);
  go(random_prompt(200, model_->config().vocab_size, 77));
  EXPECT_GT(engine->metrics().blocks_evicted, 0);
  EXPECT_EQ(engine->cache().num_used_blocks(), 0);
  engine->cache().check_invariants();
}

TEST_F(EnginePrefixTest, KiviBlocksArePublishedWhenSealed) {
  // KIVI keys are quantized per channel over a whole block, once it leaves the residual window:
  // only then are its bytes final. With a window of 32, a 200-token prompt seals blocks up to
  // token 168: 10 whole blocks (160 tokens) are published.
  EngineOptions options = options_;
  options.k_type = options.v_type = KvType::kKivi4;
  options.storage.kivi_residual_tokens = 32;
  auto engine = Engine::create(*model_, pool_, options).value();
  RequestOutput first;
  ASSERT_TRUE(engine->submit(request(base_, 1), collect_into(first)).ok());
  engine->run_until_idle();
  EXPECT_EQ(engine->metrics().blocks_published, 10);
  std::vector<TokenId> second_prompt(base_.begin(), base_.begin() + 180);
  const std::vector<TokenId> tail = random_prompt(20, model_->config().vocab_size, 6);
  second_prompt.insert(second_prompt.end(), tail.begin(), tail.end());
  RequestOutput second;
  ASSERT_TRUE(engine->submit(request(second_prompt, 6), collect_into(second)).ok());
  engine->run_until_idle();
  EXPECT_EQ(second.stats.cached_prompt_tokens, 160);
  const RequestOutput alone = run_alone(*model_, options, request(second_prompt, 6));
  EXPECT_EQ(second.tokens, alone.tokens);
  EXPECT_EQ(engine->cache().num_used_blocks(), 0);
}

}  // namespace
}  // namespace kvlm
