// EvictingSequence against the oracle: a no-cache double-precision forward in which every token
// sees exactly what the policy left it. Also: the exact full-cache equality within the budget,
// flat memory, no leaks, every codec and block size, and the copy-on-write rule for shared blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include "cache/kv_cache_manager.h"
#include "core/rng.h"
#include "evict/evicting_sequence.h"
#include "evict/eviction_selection.h"
#include "kv/kv_storage.h"
#include "model/llama_model.h"
#include "model/model_synthesizer.h"
#include "reference/reference_forward.h"
#include "evict_test_util.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

using testing::contiguous_rule;
using testing::random_tokens;

LlamaModel& tiny_model(const std::string& preset) { return testing::eviction_test_model(preset); }

// One run: a prompt in one forward, then one token per forward.
struct PolicyRun {
  std::vector<float> logits;                   // [n, vocab]
  std::vector<std::vector<int64_t>> live;      // [n - prompt]: live positions after each decode step
  EvictionStats stats;
  int max_blocks_held = 0;
  bool pool_full_after = false;
};

struct RunSetup {
  EvictionOptions eviction;
  KvType k_type = KvType::kF32;
  KvType v_type = KvType::kF32;
  int block_size = 4;
  int kivi_residual = 0;
};

PolicyRun run_policy(LlamaModel& model, const RunSetup& setup, std::span<const TokenId> tokens, int prompt_len) {
  const ModelConfig& c = model.config();
  const KvLayout layout{c.num_layers, c.num_kv_heads, c.head_dim, setup.block_size};
  const int num_blocks = EvictingSequence::max_blocks(setup.eviction, setup.block_size, prompt_len,
                                                      static_cast<int64_t>(tokens.size()));
  auto storage = KvStorage::create(layout, setup.k_type, setup.v_type, num_blocks,
                                   KvStorageOptions{.kivi_residual_tokens = setup.kivi_residual})
                     .value();
  KvCacheManager cache(num_blocks, setup.block_size);
  ThreadPool pool(2);
  PolicyRun run;
  {
    EvictingSequence seq(model, cache, *storage, setup.eviction);
    std::vector<float> logits;
    EXPECT_TRUE(seq.forward(tokens.first(static_cast<size_t>(prompt_len)), LogitsRows::kAll, pool, logits).ok());
    run.logits = logits;
    for (size_t t = static_cast<size_t>(prompt_len); t < tokens.size(); ++t) {
      const Status s = seq.forward(tokens.subspan(t, 1), LogitsRows::kLast, pool, logits);
      EXPECT_TRUE(s.ok()) << s.message();
      run.logits.insert(run.logits.end(), logits.begin(), logits.end());
      run.live.push_back(seq.live_positions());
      run.max_blocks_held = std::max(run.max_blocks_held, cache.num_used_blocks());
      if (setup.eviction.policy != EvictionPolicy::kNone) {
        EXPECT_LE(seq.num_live(), setup.eviction.budget);
      }
    }
    run.stats = seq.stats();
  }
  run.pool_full_after = cache.num_free_blocks() == num_blocks;
  return run;
}

ReferenceVisibility recorded_rule(const PolicyRun& run, int prompt_len) {
  return testing::recorded_rule(run.live, prompt_len);
}

double error_vs(const LlamaModel& model, std::span<const TokenId> tokens, const PolicyRun& run,
                const ReferenceVisibility& rule) {
  return max_relative_error(run.logits, reference_logits(model.config(), model.weights(), tokens, rule));
}

EvictionOptions policy(EvictionPolicy p, int budget) { return testing::test_policy(p, budget); }

TEST(EvictingSequence, BudgetAboveTheLengthEqualsTheFullCacheBitForBit) {
  LlamaModel& model = tiny_model("tiny-gqa");
  const std::vector<TokenId> tokens = random_tokens(40, model.config().vocab_size, 1);
  RunSetup full;
  const PolicyRun baseline = run_policy(model, full, tokens, 30);
  for (EvictionPolicy p : all_eviction_policies()) {
    if (p == EvictionPolicy::kNone) continue;
    RunSetup setup;
    setup.eviction = policy(p, 64);
    const PolicyRun run = run_policy(model, setup, tokens, 30);
    EXPECT_EQ(run.logits, baseline.logits) << eviction_policy_name(p);
    EXPECT_EQ(run.stats.tokens_evicted, 0) << eviction_policy_name(p);
  }
}

TEST(EvictingSequence, WindowAndStreamingMatchTheOracleFarPastTheContext) {
  // tiny-gqa's context is 256: 300 tokens run past it, with a budget of 24.
  LlamaModel& model = tiny_model("tiny-gqa");
  const std::vector<TokenId> tokens = random_tokens(300, model.config().vocab_size, 2);
  for (EvictionPolicy p : {EvictionPolicy::kWindow, EvictionPolicy::kStreaming}) {
    for (int bs : {1, 4, 16}) {
      RunSetup setup;
      setup.eviction = policy(p, 24);
      setup.block_size = bs;
      const PolicyRun run = run_policy(model, setup, tokens, 40);  // the prompt alone overflows the budget
      const ReferenceVisibility rule = contiguous_rule(setup.eviction);
      EXPECT_LE(error_vs(model, tokens, run, rule), 1e-4) << eviction_policy_name(p) << " bs " << bs;
      // The live set is the rule's, and nothing was ever copied: whole blocks were dropped.
      for (size_t i = 0; i < run.live.size(); ++i) {
        const int64_t t = 40 + static_cast<int64_t>(i);
        std::vector<int64_t> want;
        for (int64_t s = 0; s <= t; ++s) {
          if (rule.visible(t, s)) want.push_back(s);
        }
        ASSERT_EQ(run.live[i], want) << eviction_policy_name(p) << " bs " << bs << " t " << t;
      }
      EXPECT_EQ(run.stats.tokens_moved, 0);
      EXPECT_EQ(run.stats.tokens_evicted, 300 - 24);
      EXPECT_GT(run.stats.blocks_dropped, 0);
      EXPECT_LE(run.max_blocks_held, EvictingSequence::max_blocks(setup.eviction, bs, 40, 300));
      EXPECT_TRUE(run.pool_full_after);
    }
  }
}

TEST(EvictingSequence, H2oAndSnapKvMatchTheOracleOnTheTokensTheyKept) {
  LlamaModel& model = tiny_model("tiny-gqa");
  const std::vector<TokenId> tokens = random_tokens(90, model.config().vocab_size, 3);
  for (EvictionPolicy p : {EvictionPolicy::kH2o, EvictionPolicy::kSnapKv}) {
    for (int bs : {1, 4, 16}) {
      RunSetup setup;
      setup.eviction = policy(p, 20);
      setup.block_size = bs;
      // H2O's prompt fits the budget; SnapKV's overflows it and is compressed after it runs.
      const int prompt = p == EvictionPolicy::kH2o ? 20 : 40;
      const PolicyRun run = run_policy(model, setup, tokens, prompt);
      EXPECT_LE(error_vs(model, tokens, run, recorded_rule(run, prompt)), 1e-4)
          << eviction_policy_name(p) << " bs " << bs;
      for (size_t i = 0; i < run.live.size(); ++i) {
        const int64_t t = prompt + static_cast<int64_t>(i);
        const std::vector<int64_t>& live = run.live[i];
        ASSERT_EQ(static_cast<int>(live.size()), std::min<int64_t>(20, t + 1));
        ASSERT_TRUE(std::is_sorted(live.begin(), live.end()));
        ASSERT_EQ(live.back(), t);  // the new token is always there
        if (p == EvictionPolicy::kH2o) {  // the newest budget / 2 are always kept
          for (int64_t r = t - 9; r <= t; ++r) ASSERT_TRUE(std::binary_search(live.begin(), live.end(), r));
        }
      }
      EXPECT_GT(run.stats.compactions, 0);
      EXPECT_GT(run.stats.weight_passes, 0);
      EXPECT_TRUE(run.pool_full_after);
    }
  }
}

TEST(EvictingSequence, EveryPolicyMatchesTheOracleWithMultiQueryAttention) {
  LlamaModel& model = tiny_model("tiny-mqa");
  const std::vector<TokenId> tokens = random_tokens(60, model.config().vocab_size, 10);
  for (EvictionPolicy p : {EvictionPolicy::kWindow, EvictionPolicy::kStreaming, EvictionPolicy::kH2o,
                           EvictionPolicy::kSnapKv}) {
    RunSetup setup;
    setup.eviction = policy(p, 16);
    setup.block_size = 4;
    const int prompt = p == EvictionPolicy::kH2o ? 16 : 24;
    const PolicyRun run = run_policy(model, setup, tokens, prompt);
    const ReferenceVisibility rule = (p == EvictionPolicy::kWindow || p == EvictionPolicy::kStreaming)
                                         ? contiguous_rule(setup.eviction)
                                         : recorded_rule(run, prompt);
    EXPECT_LE(error_vs(model, tokens, run, rule), 1e-4) << eviction_policy_name(p);
    EXPECT_TRUE(run.pool_full_after) << eviction_policy_name(p);
  }
}

TEST(EvictingSequence, SnapKvKeepsThePromptTokensTheObservationWindowAttendsTo) {
  // The kept prompt tokens are exactly snapkv_kept over the oracle's own votes: its
  // double-precision attention of the last 6 prompt queries, summed over heads and layers.
  LlamaModel& model = tiny_model("tiny-gqa");
  const std::vector<TokenId> tokens = random_tokens(40, model.config().vocab_size, 4);
  const EvictionOptions o = policy(EvictionPolicy::kSnapKv, 20);
  std::vector<double> votes;
  reference_logits(model.config(), model.weights(), tokens, ReferenceVisibility{}, &votes, 40 - o.snapkv_window);
  const std::vector<float> votes_f(votes.begin(), votes.end());
  const std::vector<int> want = snapkv_kept(votes_f, o.snapkv_window, o.snapkv_kernel, o.budget);

  const ModelConfig& c = model.config();
  auto storage =
      KvStorage::create({c.num_layers, c.num_kv_heads, c.head_dim, 4}, KvType::kF32, KvType::kF32, 32).value();
  KvCacheManager cache(32, 4);
  ThreadPool pool(1);
  EvictingSequence seq(model, cache, *storage, o);
  std::vector<float> logits;
  ASSERT_TRUE(seq.forward(tokens, LogitsRows::kLast, pool, logits).ok());
  const std::vector<int64_t> kept = seq.live_positions();
  ASSERT_EQ(kept.size(), want.size());
  for (size_t i = 0; i < kept.size(); ++i) EXPECT_EQ(kept[i], want[i]) << i;
  EXPECT_EQ(seq.stats().compactions, 1);
  EXPECT_EQ(seq.num_live(), 20);
}

TEST(EvictingSequence, EveryCodecAndBlockSizeAddsNoErrorBeyondTheCodecsOwn) {
  LlamaModel& model = tiny_model("tiny-mha");
  const std::vector<TokenId> tokens = random_tokens(64, model.config().vocab_size, 5);
  for (KvType type : all_kv_types()) {
    for (int bs : {1, 16}) {
      RunSetup full;
      full.k_type = full.v_type = type;
      full.block_size = bs;
      const PolicyRun full_run = run_policy(model, full, tokens, 24);
      const double codec_error = error_vs(model, tokens, full_run, ReferenceVisibility{});
      for (EvictionPolicy p : {EvictionPolicy::kWindow, EvictionPolicy::kStreaming, EvictionPolicy::kH2o,
                               EvictionPolicy::kSnapKv}) {
        RunSetup setup = full;
        setup.eviction = policy(p, 20);
        const int prompt = p == EvictionPolicy::kH2o ? 20 : 24;
        const PolicyRun run = run_policy(model, setup, tokens, prompt);
        const ReferenceVisibility rule = (p == EvictionPolicy::kWindow || p == EvictionPolicy::kStreaming)
                                             ? contiguous_rule(setup.eviction)
                                             : recorded_rule(run, prompt);
        const double error = error_vs(model, tokens, run, rule);
        EXPECT_LE(error, std::max(3.0 * codec_error, 1e-4))
            << kv_type_name(type) << " " << eviction_policy_name(p) << " bs " << bs << " (codec alone "
            << codec_error << ")";
        EXPECT_TRUE(run.pool_full_after) << kv_type_name(type) << " " << eviction_policy_name(p);
      }
    }
  }
}

TEST(EvictingSequence, MemoryStaysFlatOverALongRunAndNothingLeaks) {
  LlamaModel& model = tiny_model("tiny-gqa");
  const std::vector<TokenId> tokens = random_tokens(1500, model.config().vocab_size, 6);
  for (EvictionPolicy p : {EvictionPolicy::kStreaming, EvictionPolicy::kH2o}) {
    RunSetup setup;
    setup.eviction = policy(p, 32);
    setup.k_type = KvType::kKivi4;  // staging must be returned too
    setup.v_type = KvType::kInt8;
    setup.kivi_residual = 8;
    setup.block_size = 8;
    const ModelConfig& c = model.config();
    const int num_blocks = EvictingSequence::max_blocks(setup.eviction, 8, 1, 1500);
    auto storage = KvStorage::create({c.num_layers, c.num_kv_heads, c.head_dim, 8}, setup.k_type, setup.v_type,
                                     num_blocks, KvStorageOptions{.kivi_residual_tokens = 8})
                       .value();
    KvCacheManager cache(num_blocks, 8);
    ThreadPool pool(1);
    {
      EvictingSequence seq(model, cache, *storage, setup.eviction);
      std::vector<float> logits;
      for (TokenId t : tokens) {
        ASSERT_TRUE(seq.forward(std::span<const TokenId>(&t, 1), LogitsRows::kLast, pool, logits).ok());
        ASSERT_LE(cache.num_used_blocks(), num_blocks);
        ASSERT_LE(storage->staging_bytes(), storage->residual_bytes_per_sequence());
      }
      EXPECT_EQ(seq.num_live(), 32);
      EXPECT_EQ(seq.stats().tokens_evicted, 1500 - 32);
    }
    EXPECT_EQ(cache.num_free_blocks(), num_blocks) << eviction_policy_name(p);
    // Every staging buffer went back with its block (the buffers themselves stay for reuse).
    for (int layer = 0; layer < c.num_layers; ++layer) {
      for (int b = 0; b < num_blocks; ++b) EXPECT_FALSE(storage->is_staged(layer, BlockId(b))) << layer << " " << b;
    }
  }
}

TEST(EvictingSequence, SharedBlocksAreCopiedBeforeTheyAreWrittenAndTheOtherOwnerReadsThemIntact) {
  // A forks B; both go on with different tokens, under H2O (compaction writes old blocks) and
  // streaming (appends into the shared tail). Each must equal a sequence run alone on its history.
  LlamaModel& model = tiny_model("tiny-gqa");
  const int vocab = model.config().vocab_size;
  const std::vector<TokenId> common = random_tokens(18, vocab, 7);
  const std::vector<TokenId> tail_a = random_tokens(12, vocab, 8);
  const std::vector<TokenId> tail_b = random_tokens(12, vocab, 9);
  for (EvictionPolicy p : {EvictionPolicy::kH2o, EvictionPolicy::kStreaming}) {
    const ModelConfig& c = model.config();
    auto storage =
        KvStorage::create({c.num_layers, c.num_kv_heads, c.head_dim, 4}, KvType::kF16, KvType::kF16, 64).value();
    KvCacheManager cache(64, 4);
    ThreadPool pool(1);
    const EvictionOptions o = policy(p, 16);
    auto feed = [&](EvictingSequence& s, std::span<const TokenId> toks) {
      return testing::feed_one_by_one(s, toks, pool);
    };
    {
      EvictingSequence a(model, cache, *storage, o);
      feed(a, common);
      auto b = a.fork().value();
      const std::vector<float> got_a = feed(a, tail_a);
      const std::vector<float> got_b = feed(*b, tail_b);
      EXPECT_GT(a.stats().blocks_copied + b->stats().blocks_copied, 0) << eviction_policy_name(p);
      for (const auto* tail : {&tail_a, &tail_b}) {
        EvictingSequence alone(model, cache, *storage, o);
        feed(alone, common);
        const std::vector<float> want = feed(alone, *tail);
        EXPECT_EQ(tail == &tail_a ? got_a : got_b, want) << eviction_policy_name(p);
      }
    }
    EXPECT_EQ(cache.num_free_blocks(), 64) << eviction_policy_name(p);
  }
}

}  // namespace
}  // namespace kvlm

namespace kvlm {
namespace {

// A compaction that must copy a shared block when the pool is full answers "no room" (0 tokens
// planned, nothing evicted), so the engine preempts, instead of aborting (found by the server's
// load test: an H2O request's published blocks attached by another request, pool full).
TEST(EvictingSequenceNoRoom, CompactionThatCannotCopyASharedBlockPlansNothingAndRetries) {
  LlamaModel& model = tiny_model("tiny-gqa");
  const ModelConfig& c = model.config();
  for (EvictionPolicy p : {EvictionPolicy::kH2o, EvictionPolicy::kSnapKv}) {
    SCOPED_TRACE(eviction_policy_name(p));
    EvictionOptions o;
    o.policy = p;
    o.budget = 20;
    o.recent = 4;
    o.snapkv_window = 4;
    constexpr int kBlocks = 16;
    auto storage = KvStorage::create({c.num_layers, c.num_kv_heads, c.head_dim, 4}, KvType::kF32, KvType::kF32,
                                     kBlocks)
                       .value();
    KvCacheManager cache(kBlocks, 4);
    ThreadPool pool(1);
    EvictingSequence seq(model, cache, *storage, o);
    std::vector<float> logits;
    const std::vector<TokenId> tokens = random_tokens(26, c.vocab_size, 9);
    ASSERT_TRUE(seq.forward(std::span(tokens).first(20), LogitsRows::kLast, pool, logits).ok());
    auto twin = seq.fork().value();  // shares every block
    const SeqId filler = cache.create_sequence();
    ASSERT_TRUE(cache.reserve(filler, cache.num_free_blocks() * 4));
    ASSERT_EQ(cache.num_free_blocks(), 0);
    SequenceStep step;
    const std::span<const TokenId> next = std::span(tokens).subspan(20, 1);
    const int64_t evicted_before = seq.stats().tokens_evicted;
    auto planned = seq.plan_step(next, LogitsRows::kLast, step);
    ASSERT_TRUE(planned.ok());
    EXPECT_EQ(*planned, 0) << "no block to copy into: nothing planned";
    EXPECT_EQ(seq.stats().tokens_evicted, evicted_before) << "nothing evicted";
    cache.free_sequence(filler);
    planned = seq.plan_step(next, LogitsRows::kLast, step);
    ASSERT_TRUE(planned.ok());
    EXPECT_EQ(*planned, 1);
    model.forward(step, *storage, pool, logits);
    seq.commit_step();
    EXPECT_EQ(seq.num_live(), 20);
  }
}

}  // namespace
}  // namespace kvlm
