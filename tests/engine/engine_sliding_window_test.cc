// The engine on a model with sliding-window layers (gemma3): many requests batched in one pool
// whose local layers keep only their windows, against the no-cache reference; preemption; prefix
// hits over retained windows; token eviction and KIVI.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "engine/engine.h"
#include "engine_test_util.h"
#include "model/sliding_window.h"
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
  // Local slots for the windows of 6 sequences and one more (compactions, retained windows), and
  // the 24 tokens of a step once, not for the pool's 512 blocks.
  const int64_t running = local_slots_needed(model.config().sliding_window, block_size, 6, 24);
  EXPECT_EQ(storage.num_blocks(0), std::min<int64_t>(512, local_slots_needed(model.config().sliding_window,
                                                                                block_size, 7, 24)));
  EXPECT_EQ(running, 6 * (KvStorage::local_blocks_per_sequence(window, block_size, 1) + 1) + (24 + block_size - 1) / block_size);
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
  EXPECT_LE(most_local, running);
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

// Prefix caching: a later request attaches the blocks of an earlier one's prompt, and the local
// layers' window before the hit comes back from the slots the finished request left retained.
TEST(EngineSlidingWindow, PrefixHitsReuseRetainedWindowsAndMatchTheNoCacheForward) {
  LlamaModel& model = testing::tiny_engine_model("gemma3-tiny");
  ThreadPool pool(2);
  for (int block_size : {1, 4, 16}) {
    SCOPED_TRACE(fmt::format("block size {}", block_size));
    EngineOptions options = gemma_options(block_size);
    options.prefix_caching = true;
    auto engine = Engine::create(model, pool, options).value();
    EXPECT_TRUE(engine->warnings().empty());
    const int vocab = model.config().vocab_size;
    const std::vector<TokenId> shared = random_prompt(70, vocab, 31);  // far past the window of 24
    RequestOutput first;
    RequestOptions r1 = testing::greedy_request(shared, 6);
    ASSERT_TRUE(engine->submit(r1, collect_into(first)).ok());
    engine->run_until_idle();
    EXPECT_EQ(first.stats.cached_prompt_tokens, 0);
    EXPECT_EQ(engine->storage().local_blocks_in_use(), 0);
    EXPECT_GT(engine->storage().local_blocks_retained(), 0);

    // A longer prompt over the same 70 tokens: every full block of them is a hit.
    std::vector<TokenId> longer = shared;
    const std::vector<TokenId> more = random_prompt(15, vocab, 32);
    longer.insert(longer.end(), more.begin(), more.end());
    RequestOptions r2 = testing::greedy_request(longer, 8);
    r2.logits = LogitsCapture::kAll;
    RequestOutput second;
    ASSERT_TRUE(engine->submit(r2, collect_into(second)).ok());
    engine->run_until_idle();
    EXPECT_EQ(second.stats.cached_prompt_tokens, 70 / block_size * block_size);
    // The captured rows are the computed ones: from the first token after the hit.
    std::vector<TokenId> all = longer;
    all.insert(all.end(), second.tokens.begin(), second.tokens.end());
    all.pop_back();
    const std::vector<double> expected = reference_logits(model.config(), model.weights(), all);
    const size_t vocab_size = static_cast<size_t>(vocab);
    const size_t skipped = static_cast<size_t>(second.stats.cached_prompt_tokens) * vocab_size;
    ASSERT_EQ(second.logits.size() + skipped, expected.size());
    EXPECT_LE(max_relative_error(second.logits, std::span<const double>(expected).subspan(skipped)), 1e-4);
    // Greedy tokens equal a run without the cache.
    EXPECT_EQ(second.tokens, testing::run_alone(model, options, r2).tokens);
    EXPECT_EQ(engine->storage().local_blocks_in_use(), 0);
    EXPECT_EQ(engine->leaked_blocks(), 0);
  }
}

// A prefix whose window blocks lost their local bytes (other requests took the retained slots)
// is no hit: the global blocks are still cached, but a hit needs the window before it too.
TEST(EngineSlidingWindow, AHitWhoseWindowWasReclaimedIsComputedAgain) {
  LlamaModel& model = testing::tiny_engine_model("gemma3-tiny");
  ThreadPool pool(2);
  EngineOptions options = gemma_options(4);
  options.prefix_caching = true;
  options.max_seqs = 1;  // local slots for two sequences' windows: little to retain
  auto engine = Engine::create(model, pool, options).value();
  const int vocab = model.config().vocab_size;
  const std::vector<TokenId> shared = random_prompt(60, vocab, 41);
  RequestOutput first;
  ASSERT_TRUE(engine->submit(testing::greedy_request(shared, 4), collect_into(first)).ok());
  engine->run_until_idle();
  // Unrelated long requests cycle every local slot.
  for (int i = 0; i < 3; ++i) {
    RequestOutput other;
    ASSERT_TRUE(engine->submit(testing::greedy_request(random_prompt(90, vocab, 50 + i), 4), collect_into(other))
                    .ok());
    engine->run_until_idle();
  }
  std::vector<TokenId> again = shared;
  again.push_back(7);
  RequestOptions r = testing::greedy_request(again, 6);
  RequestOutput out;
  ASSERT_TRUE(engine->submit(r, collect_into(out)).ok());
  engine->run_until_idle();
  EXPECT_EQ(out.finish, FinishReason::kLength) << out.error;
  EXPECT_EQ(out.stats.cached_prompt_tokens, 0);
  EXPECT_EQ(out.tokens, testing::run_alone(model, options, r).tokens);
  EXPECT_EQ(engine->leaked_blocks(), 0);
  EXPECT_EQ(engine->storage().local_blocks_in_use(), 0);
}

// Token eviction and KIVI on a model with local layers, batched with each other.
TEST(EngineSlidingWindow, EvictionPoliciesAndKiviRunBatchedAsTheyRunAlone) {
  LlamaModel& model = testing::tiny_engine_model("gemma3-tiny");
  ThreadPool pool(2);
  for (KvType type : {KvType::kF32, KvType::kKivi4}) {
    SCOPED_TRACE(kv_type_name(type));
    EngineOptions options = gemma_options(4);
    options.k_type = options.v_type = type;
    options.storage.kivi_residual_tokens = is_kivi(type) ? 8 : 0;
    std::vector<RequestOptions> requests;
    int i = 0;
    for (EvictionPolicy p : {EvictionPolicy::kNone, EvictionPolicy::kWindow, EvictionPolicy::kStreaming,
                             EvictionPolicy::kH2o, EvictionPolicy::kSnapKv}) {
      RequestOptions r = testing::greedy_request(random_prompt(30 + 7 * i, model.config().vocab_size, 60 + i), 40);
      r.eviction.policy = p;
      r.eviction.budget = p == EvictionPolicy::kNone ? 0 : 20 + 8 * i;
      r.eviction.sinks = 4;
      r.eviction.snapkv_window = 6;
      requests.push_back(r);
      ++i;
    }
    std::vector<RequestOutput> solo;
    for (const RequestOptions& r : requests) solo.push_back(testing::run_alone(model, options, r));
    auto engine = Engine::create(model, pool, options).value();
    std::vector<RequestOutput> outputs(requests.size());
    for (size_t j = 0; j < requests.size(); ++j) {
      ASSERT_TRUE(engine->submit(requests[j], collect_into(outputs[j])).ok());
    }
    engine->run_until_idle();
    for (size_t j = 0; j < requests.size(); ++j) {
      EXPECT_EQ(outputs[j].finish, FinishReason::kLength) << outputs[j].error;
      EXPECT_EQ(outputs[j].tokens, solo[j].tokens) << eviction_policy_name(requests[j].eviction.policy);
    }
    EXPECT_EQ(engine->storage().local_blocks_in_use(), 0);
    EXPECT_EQ(engine->leaked_blocks(), 0);
  }
}

// With the no-cache oracle: a streaming request on the engine, logits captured.
TEST(EngineSlidingWindow, StreamingRequestMatchesTheOracle) {
  LlamaModel& model = testing::tiny_engine_model("gemma3-tiny");
  ThreadPool pool(2);
  auto engine = Engine::create(model, pool, gemma_options(4)).value();
  RequestOptions r = testing::greedy_request(random_prompt(30, model.config().vocab_size, 70), 60);
  r.eviction.policy = EvictionPolicy::kStreaming;
  r.eviction.budget = 32;
  r.eviction.sinks = 4;
  r.logits = LogitsCapture::kAll;
  RequestOutput out;
  ASSERT_TRUE(engine->submit(r, collect_into(out)).ok());
  engine->run_until_idle();
  std::vector<TokenId> all = r.prompt;
  all.insert(all.end(), out.tokens.begin(), out.tokens.end());
  all.pop_back();
  // StreamingLLM's rule (positions): the first 4 and the newest 28 once past the budget; the
  // oracle adds the local layers' window itself.
  ReferenceVisibility rule;
  rule.visible = [](int64_t t, int64_t s) { return t < 32 || s > t - 28 || s < 4; };
  rule.query_position = [](int64_t t, int64_t s) { return (t >= 32 && s < 4) ? 31 : t; };
  const std::vector<double> expected = reference_logits(model.config(), model.weights(), all, rule);
  ASSERT_EQ(out.logits.size(), expected.size());
  EXPECT_LE(max_relative_error(out.logits, expected), 1e-4);
}

}  // namespace
}  // namespace kvlm

namespace kvlm {
namespace {

// A random mix on a small pool: shared prefixes (hits over retained windows), every eviction
// policy, KIVI, cancellations mid-flight and preemptions. Every request without a policy that ran
// to its end equals the same request run alone (an evicting one depends on how the scheduler cut
// its prompt into steps, so only its completion is checked), and afterwards no block and no local
// pin is left.
TEST(EngineSlidingWindow, RandomMixWithCancellationsAndPreemptionsLeavesNothingBehind) {
  LlamaModel& model = testing::tiny_engine_model("gemma3-tiny");
  const int vocab = model.config().vocab_size;
  ThreadPool pool(2);
  for (KvType type : {KvType::kF16, KvType::kKivi4}) {
    SCOPED_TRACE(kv_type_name(type));
    EngineOptions options = gemma_options(4);
    options.k_type = options.v_type = type;
    options.storage.kivi_residual_tokens = is_kivi(type) ? 8 : 0;
    options.num_blocks = 32;  // a few requests at a time: the rest wait or are preempted
    options.max_seqs = 4;
    options.max_batch_tokens = 16;
    options.prefix_caching = true;
    auto engine = Engine::create(model, pool, options).value();
    Rng rng(type == KvType::kF16 ? 101 : 202);
    const std::vector<TokenId> common = random_prompt(50, vocab, 77);
    constexpr EvictionPolicy kPolicies[] = {EvictionPolicy::kNone, EvictionPolicy::kWindow, EvictionPolicy::kStreaming,
                                            EvictionPolicy::kH2o, EvictionPolicy::kSnapKv};
    std::vector<RequestOptions> requests;
    for (int i = 0; i < 14; ++i) {
      std::vector<TokenId> prompt(common.begin(), common.begin() + static_cast<ptrdiff_t>(rng.next_u64() % 50));
      const std::vector<TokenId> own = random_prompt(3 + static_cast<int>(rng.next_u64() % 30), vocab, 300 + i);
      prompt.insert(prompt.end(), own.begin(), own.end());
      RequestOptions r = testing::greedy_request(prompt, 5 + static_cast<int>(rng.next_u64() % 30));
      r.eviction.policy = i % 2 == 0 ? EvictionPolicy::kNone : kPolicies[rng.next_u64() % 5];
      if (r.eviction.policy != EvictionPolicy::kNone) r.eviction.budget = 20 + static_cast<int>(rng.next_u64() % 30);
      r.eviction.sinks = 4;
      r.eviction.snapkv_window = 6;
      requests.push_back(r);
    }
    std::vector<RequestOutput> outputs(requests.size());
    std::vector<RequestId> ids;
    for (size_t i = 0; i < requests.size(); ++i) ids.push_back(engine->submit(requests[i], collect_into(outputs[i])).value());
    std::vector<bool> cancelled(requests.size(), false);
    int steps = 0;
    while (engine->step()) {
      if (++steps % 7 == 0) {
        const size_t victim = rng.next_u64() % requests.size();
        if (engine->cancel(ids[victim])) cancelled[victim] = true;
      }
    }
    int compared = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (outputs[i].finish == FinishReason::kCancelled) continue;
      EXPECT_EQ(outputs[i].finish, FinishReason::kLength) << i << ": " << outputs[i].error;
      if (requests[i].eviction.policy != EvictionPolicy::kNone) continue;
      EXPECT_EQ(outputs[i].tokens, testing::run_alone(model, options, requests[i]).tokens)
          << "request " << i << " policy " << eviction_policy_name(requests[i].eviction.policy) << " budget "
          << requests[i].eviction.budget << " prompt " << requests[i].prompt.size() << " cached "
          << outputs[i].stats.cached_prompt_tokens << " preempted " << outputs[i].stats.preemptions;
      ++compared;
    }
    EXPECT_GE(compared, 3);
    EXPECT_GT(engine->metrics().prefix_hit_tokens, 0);
    EXPECT_GT(engine->metrics().preemptions, 0);
    EXPECT_GT(std::count(cancelled.begin(), cancelled.end(), true), 0);
    EXPECT_EQ(engine->storage().local_blocks_in_use(), 0);
    EXPECT_EQ(engine->leaked_blocks(), 0);
    EXPECT_EQ(engine->cache().num_used_blocks(), 0);
  }
}

}  // namespace
}  // namespace kvlm
