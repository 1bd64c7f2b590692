// The engine on an MLA model (deepseek2): batched requests over one pool of latent rows, prefix
// hits over quantized latents, preemption, and outputs equal to each request run alone.
#include <gtest/gtest.h>

#include "engine/engine_test_util.h"

namespace kvlm {
namespace {

using testing::collect_into;
using testing::random_prompt;
using testing::RequestOutput;
using testing::run_alone;

class EngineMlaTest : public ::testing::TestWithParam<KvType> {
 protected:
  void SetUp() override {
    model_ = &testing::tiny_engine_model("deepseek2-tiny-moe");
    options_.k_type = options_.v_type = GetParam();
    options_.block_size = 16;
    options_.num_blocks = 128;
    options_.max_batch_tokens = 256;
  }
  LlamaModel* model_ = nullptr;
  ThreadPool pool_{2};
  EngineOptions options_;
};

TEST_P(EngineMlaTest, SharedPrefixesHitAndBatchesMatchEachRequestAlone) {
  auto engine = Engine::create(*model_, pool_, options_).value();
  const int vocab = model_->config().vocab_size;
  const std::vector<TokenId> base = random_prompt(100, vocab, 3);
  std::vector<RequestOptions> requests;
  for (int i = 0; i < 4; ++i) {
    std::vector<TokenId> prompt(base.begin(), base.begin() + 70 + 5 * i);
    const std::vector<TokenId> tail = random_prompt(10 + i, vocab, 10 + static_cast<uint64_t>(i));
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    RequestOptions r = testing::greedy_request(prompt, 12);
    r.logits = LogitsCapture::kSampled;
    requests.push_back(r);
  }
  // The first runs alone and publishes its blocks; the other three then run together and hit.
  RequestOutput first;
  ASSERT_TRUE(engine->submit(requests[0], collect_into(first)).ok());
  engine->run_until_idle();
  std::vector<RequestOutput> outs(requests.size() - 1);
  for (size_t i = 1; i < requests.size(); ++i) ASSERT_TRUE(engine->submit(requests[i], collect_into(outs[i - 1])).ok());
  engine->run_until_idle();
  EXPECT_EQ(engine->leaked_blocks(), 0);
  for (size_t i = 1; i < requests.size(); ++i) {
    const RequestOutput& out = outs[i - 1];
    EXPECT_GE(out.stats.cached_prompt_tokens, 64) << i;  // 70+ shared tokens: four whole blocks at least
    const RequestOutput alone = run_alone(*model_, options_, requests[i]);
    EXPECT_EQ(out.tokens, alone.tokens) << i;
    EXPECT_LE(testing::relative_difference(out.logits, alone.logits), 1e-5) << i;
  }
}

TEST_P(EngineMlaTest, APoolTooSmallForEveryonePreemptsAndStillMatches) {
  EngineOptions small = options_;
  small.num_blocks = 12;  // four 60-token requests need 16 blocks at once
  small.prefix_caching = false;
  auto engine = Engine::create(*model_, pool_, small).value();
  const int vocab = model_->config().vocab_size;
  std::vector<RequestOptions> requests;
  std::vector<RequestOutput> outs(4);
  for (int i = 0; i < 4; ++i) {
    requests.push_back(testing::greedy_request(random_prompt(40, vocab, 30 + static_cast<uint64_t>(i)), 20));
    ASSERT_TRUE(engine->submit(requests.back(), collect_into(outs[static_cast<size_t>(i)])).ok());
  }
  engine->run_until_idle();
  EXPECT_GT(engine->metrics().preemptions, 0);
  EXPECT_EQ(engine->leaked_blocks(), 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(outs[i].tokens, run_alone(*model_, small, requests[i]).tokens) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Latents, EngineMlaTest,
                         ::testing::Values(KvType::kF32, KvType::kF16, KvType::kInt8, KvType::kInt4),
                         [](const auto& info) { return std::string(kv_type_name(info.param)); });

}  // namespace
}  // namespace kvlm
