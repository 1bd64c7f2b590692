// The engine on a model with sliding-window layers (gemma3): many requests batched in one pool
// whose local layers keep only their windows, against the no-cache reference; preemption; and
// what does not combine with local layers yet, refused or announced.
#include <gtest/gtest.h>

#include <vector>

#include "engine/engine.h"
#include "engine_test_util.h"
#include "reference/reference_forward.h"

namespace kvlm {
namespace {

using testing::collect_into;
using testing::random_prompt;
using testing::RequestOutput;

EngineOptions gemma_options(int block_size) {
  EngineOptions options;
  options.k_type = options.v_type = KvType::kF32;
  options.block_size = block_size;
  options.num_blocks = 512;
  options.max_batch_tokens = 24;
  options.max_seqs = 6;
  return options;
}

std::vector<RequestOptions> gemma_requests(const LlamaModel& model) {
  std::vector<RequestOptions> requests;
  for (int i = 0; i < 6; ++i) {
    RequestOptions r;
    // Prompts shorter and longer than the window of 24, several prefill chunks of 24 for some.
    r.prompt = random_prompt(5 + 13 * i, model.config().vocab_size, 70 + static_cast<uint64_t>(i));
    r.max_tokens = 30;
    r.stop_at_eos = false;
    r.sampler.temperature = 0;
    r.logits = LogitsCapture::kAll;
    requests.push_back(r);
  }
  return requests;
}

class EngineSlidingWindowTest : public ::testing::TestWithParam<int> {};

TEST_P(EngineSlidingWindowTest, BatchedLogitsMatchTheNoCacheForwardWithOnlyTheWindowsKept) {
  LlamaModel& model = testing::tiny_engine_model("gemma3-tiny");
  const int block_size = GetParam();
  const int window = model.config().sliding_window.window;
  ThreadPool pool(2);
  auto engine = Engine::create(model, pool, gemma_options(block_size)).value();
  const KvStorage& storage = engine->storage();
  ASSERT_TRUE(storage.has_local_layers());
  EXPECT_EQ(storage.num_local_layers(), 5);
  // Local slots for 6 sequences of steps up to 24 tokens, not for the pool's 512 blocks.
  const int per_sequence = KvStorage::local_blocks_per_sequence(window, block_size, 24);
  EXPECT_EQ(storage.num_blocks(0), std::min(512, 6 * per_sequence));
  EXPECT_EQ(storage.num_blocks(5), 512);

  const std::vector<RequestOptions> requests = gemma_requests(model);
  std::vector<RequestOutput> outputs(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(engine->submit(requests[i], collect_into(outputs[i])).ok());
  }
  int most_local = 0;
  while (engine->step()) most_local = std::max(most_local, storage.local_blocks_in_use());
  const size_t vocab = static_cast<size_t>(model.config().vocab_size);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(outputs[i].finish, FinishReason::kLength) << outputs[i].error;
    std::vector<TokenId> all = requests[i].prompt;
    all.insert(all.end(), outputs[i].tokens.begin(), outputs[i].tokens.end());
    all.pop_back();  // the last token is sampled, never forwarded
    ASSERT_EQ(outputs[i].logits.size(), all.size() * vocab) << "request " << i;
    const std::vector<double> expected = reference_logits(model.config(), model.weights(), all);
    EXPECT_LE(max_relative_error(outputs[i].logits, expected), 1e-4) << "request " << i;
  }
  // Every sequence's local layers stayed within its window and step, and gave everything back.
  EXPECT_GT(most_local, 0);
  EXPECT_LE(most_local, 6 * per_sequence);
  EXPECT_EQ(storage.local_blocks_in_use(), 0);
  EXPECT_EQ(engine->cache().num_used_blocks(), 0);
  EXPECT_EQ(engine->leaked_blocks(), 0);
}

INSTANTIATE_TEST_SUITE_P(BlockSizes, EngineSlidingWindowTest, ::testing::Values(1, 4, 16));

// The live local cache of one long request stays at the window while the global layers grow.
TEST(EngineSlidingWindow, LocalLayersOfALongRequestStayAtTheWindow) {
  LlamaModel& model = testing::tiny_engine_model("gemma3-tiny");
  ThreadPool pool(2);
  EngineOptions options = gemma_options(4);
  options.max_batch_tokens = 8;
  auto engine = Engine::create(model, pool, options).value();
  RequestOptions r;
  r.prompt = random_prompt(40, model.config().vocab_size, 9);
  r.max_tokens = 150;
  r.stop_at_eos = false;
  r.sampler.temperature = 0;
  RequestOutput out;
  ASSERT_TRUE(engine->submit(r, collect_into(out)).ok());
  int most_local = 0, most_global = 0;
  while (engine->step()) {
    most_local = std::max(most_local, engine->storage().local_blocks_in_use());
    most_global = std::max(most_global, engine->cache().num_used_blocks());
  }
  EXPECT_EQ(out.finish, FinishReason::kLength);
  // 189 forwarded tokens in 4-token blocks: 48 blocks in the global layer (seen here up to the
  // step before the last, which ends the request and frees them); the local ones at most the
  // window (24) plus a step (8), over whole blocks: ceil(31 / 4) + 1 = 9.
  EXPECT_GE(most_global, 47);
  EXPECT_LE(most_local, 9);
  EXPECT_GE(most_local, 6);  // a window of 24 tokens fills 6 blocks
  EXPECT_EQ(engine->storage().local_blocks_in_use(), 0);
}

TEST(EngineSlidingWindow, PreemptedInATinyPoolMatchesAlone) {
  LlamaModel& model = testing::tiny_engine_model("gemma3-tiny");
  EngineOptions options = gemma_options(4);
  const std::vector<RequestOptions> requests = gemma_requests(model);
  std::vector<RequestOutput> solo;
  for (const RequestOptions& r : requests) solo.push_back(testing::run_alone(model, options, r));
  options.num_blocks = 40;  // the largest request needs 27 blocks; two of them do not fit at once
  ThreadPool pool(2);
  auto engine = Engine::create(model, pool, options).value();
  std::vector<RequestOutput> outputs(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(engine->submit(requests[i], collect_into(outputs[i])).ok());
  }
  engine->run_until_idle();
  EXPECT_GT(engine->metrics().preemptions, 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(outputs[i].tokens, solo[i].tokens) << "request " << i;
  }
  EXPECT_EQ(engine->storage().local_blocks_in_use(), 0);
  EXPECT_EQ(engine->leaked_blocks(), 0);
}

TEST(EngineSlidingWindow, WhatDoesNotCombineYetIsRefusedOrAnnounced) {
  LlamaModel& model = testing::tiny_engine_model("gemma3-tiny");
  ThreadPool pool(2);
  auto engine = Engine::create(model, pool, gemma_options(16)).value();
  ASSERT_EQ(engine->warnings().size(), 1u);
  EXPECT_NE(engine->warnings()[0].find("prefix caching is off"), std::string::npos) << engine->warnings()[0];
  RequestOptions r = testing::greedy_request(random_prompt(10, model.config().vocab_size, 3), 4);
  r.eviction.policy = EvictionPolicy::kStreaming;
  r.eviction.budget = 64;
  r.eviction.sinks = 4;
  RequestOutput out;
  auto id = engine->submit(r, collect_into(out));
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.status().message().find("does not combine with the sliding-window layers"), std::string::npos)
      << id.status().message();
  EngineOptions kivi = gemma_options(16);
  kivi.k_type = kivi.v_type = KvType::kKivi4;
  auto refused = Engine::create(model, pool, kivi);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("KIVI"), std::string::npos) << refused.status().message();
}

}  // namespace
}  // namespace kvlm
