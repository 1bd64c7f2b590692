// Token eviction on a model with sliding-window layers (gemma3): the local layers mask by text
// position while eviction makes slots differ from positions, and a storage that keeps only the
// windows pins just the blocks they cover. Against the no-cache double oracle, which applies the
// policy's visibility and the local window (position t - s < window) independently.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include "cache/kv_cache_manager.h"
#include "core/rng.h"
#include "evict/evicting_sequence.h"
#include "kv/kv_storage.h"
#include "model/llama_model.h"
#include "model/model_synthesizer.h"
#include "model/sliding_window.h"
#include "reference/reference_forward.h"
#include "evict_test_util.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

using testing::contiguous_rule;
using testing::random_tokens;

LlamaModel& gemma_model() { return testing::eviction_test_model("gemma3-tiny"); }

struct WindowRunSetup {
  EvictionOptions eviction;
  KvType k_type = KvType::kF32;
  KvType v_type = KvType::kF32;
  int block_size = 4;
  int kivi_residual = 0;
  bool keep_windows = true;  // the storage's local layers keep only the windows
};

struct WindowRun {
  std::vector<float> logits;               // [n, vocab]
  std::vector<std::vector<int64_t>> live;  // [n - prompt]: live positions after each decode step
  EvictionStats stats;
  int local_slots = 0;        // the storage's local slots (0: it keeps whole sequences)
  int peak_local_pinned = 0;  // most local slots pinned at once
  int local_pinned_after = -1;
  bool pool_empty_after = false;
};

WindowRun run_sequence(LlamaModel& model, const WindowRunSetup& setup, std::span<const TokenId> tokens, int prompt_len) {
  const ModelConfig& c = model.config();
  const KvLayout layout{c.num_layers, c.num_kv_heads, c.head_dim, setup.block_size};
  const int num_blocks = EvictingSequence::max_blocks(setup.eviction, setup.block_size, prompt_len,
                                                      static_cast<int64_t>(tokens.size()));
  KvStorageOptions options{.kivi_residual_tokens = setup.kivi_residual};
  // One sequence stepping at most the prompt, and room for a compaction's second window.
  if (setup.keep_windows) keep_local_windows(c.sliding_window, setup.block_size, 2, prompt_len, num_blocks, options);
  auto storage = KvStorage::create(layout, setup.k_type, setup.v_type, num_blocks, options).value();
  KvCacheManager cache(num_blocks, setup.block_size);
  ThreadPool pool(2);
  WindowRun out;
  out.local_slots = storage->has_local_layers() ? storage->num_blocks(0) : 0;
  {
    EvictingSequence seq(model, cache, *storage, setup.eviction);
    std::vector<float> logits;
    EXPECT_TRUE(seq.forward(tokens.first(static_cast<size_t>(prompt_len)), LogitsRows::kAll, pool, logits).ok());
    out.logits = logits;
    for (size_t t = static_cast<size_t>(prompt_len); t < tokens.size(); ++t) {
      const Status s = seq.forward(tokens.subspan(t, 1), LogitsRows::kLast, pool, logits);
      EXPECT_TRUE(s.ok()) << s.message();
      out.logits.insert(out.logits.end(), logits.begin(), logits.end());
      out.live.push_back(seq.live_positions());
    }
    out.stats = seq.stats();
  }
  out.peak_local_pinned = storage->peak_local_blocks_in_use();
  out.local_pinned_after = storage->local_blocks_in_use();
  out.pool_empty_after = cache.num_free_blocks() == num_blocks;
  return out;
}

double error_vs_oracle(LlamaModel& model, std::span<const TokenId> tokens, const WindowRun& r, const WindowRunSetup& setup,
                       int prompt_len) {
  const EvictionPolicy p = setup.eviction.policy;
  const ReferenceVisibility rule = (p == EvictionPolicy::kWindow || p == EvictionPolicy::kStreaming)
                                       ? contiguous_rule(setup.eviction)
                                       : testing::recorded_rule(r.live, prompt_len);
  return max_relative_error(r.logits, reference_logits(model.config(), model.weights(), tokens, rule));
}

// The oracle adds the local layers' window by position itself.
EvictionOptions policy(EvictionPolicy p, int budget) { return testing::test_policy(p, budget); }

constexpr EvictionPolicy kPolicies[] = {EvictionPolicy::kWindow, EvictionPolicy::kStreaming, EvictionPolicy::kH2o,
                                        EvictionPolicy::kSnapKv};

TEST(EvictingSequenceSlidingWindow, EveryPolicyMatchesTheOracleWithOnlyTheWindowsKept) {
  LlamaModel& model = gemma_model();
  const int window = model.config().sliding_window.window;
  ASSERT_EQ(window, 24);
  const std::vector<TokenId> tokens = random_tokens(110, model.config().vocab_size, 21);
  // Budgets below the window (local layers see every live token but the far sinks) and above
  // it (the window cuts into the live tokens).
  for (EvictionPolicy p : kPolicies) {
    for (int budget : {16, 40}) {
      for (int bs : {1, 4, 16}) {
        SCOPED_TRACE(fmt::format("{} budget {} block size {}", eviction_policy_name(p), budget, bs));
        WindowRunSetup setup;
        setup.eviction = policy(p, budget);
        setup.block_size = bs;
        const int prompt = p == EvictionPolicy::kH2o ? budget : 48;  // SnapKV, window, streaming: overflowing prompts
        const WindowRun windowed = run_sequence(model, setup, tokens, prompt);
        EXPECT_LE(error_vs_oracle(model, tokens, windowed, setup, prompt), 1e-4);
        EXPECT_GT(windowed.stats.tokens_evicted, 0);
        // The same run over a storage that keeps every token in the local layers too: the
        // kernels read the same bytes in the same order.
        WindowRunSetup full = setup;
        full.keep_windows = false;
        const WindowRun whole = run_sequence(model, full, tokens, prompt);
        EXPECT_EQ(windowed.logits, whole.logits);
        EXPECT_EQ(whole.local_slots, 0);
        // The local layers held at most two windows (a compaction pins its destinations before
        // its sources go) and gave every pin back.
        const int per_sequence = KvStorage::local_blocks_per_sequence(window, bs, prompt);
        EXPECT_GT(windowed.local_slots, 0);
        EXPECT_LE(windowed.peak_local_pinned, std::min(windowed.local_slots, 2 * per_sequence));
        EXPECT_EQ(windowed.local_pinned_after, 0);
        EXPECT_TRUE(windowed.pool_empty_after);
      }
    }
  }
}

TEST(EvictingSequenceSlidingWindow, CodecsAddNoErrorBeyondTheirOwn) {
  LlamaModel& model = gemma_model();
  const std::vector<TokenId> tokens = random_tokens(80, model.config().vocab_size, 22);
  struct Codec {
    KvType k, v;
    int residual;
  };
  for (const Codec& codec : {Codec{KvType::kInt8, KvType::kInt8, 0}, Codec{KvType::kKivi4, KvType::kInt8, 8},
                             Codec{KvType::kKivi2, KvType::kKivi4, 16}, Codec{KvType::kFp8, KvType::kInt4, 0}}) {
    WindowRunSetup none;
    none.k_type = codec.k;
    none.v_type = codec.v;
    none.kivi_residual = codec.residual;
    none.block_size = 4;
    const WindowRun full_cache = run_sequence(model, none, tokens, 30);
    const double codec_error = error_vs_oracle(model, tokens, full_cache, none, 30);
    for (EvictionPolicy p : kPolicies) {
      SCOPED_TRACE(fmt::format("K {} V {} {}", kv_type_name(codec.k), kv_type_name(codec.v), eviction_policy_name(p)));
      WindowRunSetup setup = none;
      setup.eviction = policy(p, 20);
      const int prompt = p == EvictionPolicy::kH2o ? 20 : 30;
      const WindowRun r = run_sequence(model, setup, tokens, prompt);
      EXPECT_LE(error_vs_oracle(model, tokens, r, setup, prompt), std::max(3.0 * codec_error, 1e-4))
          << "codec alone " << codec_error;
      EXPECT_EQ(r.local_pinned_after, 0);
      EXPECT_TRUE(r.pool_empty_after);
    }
  }
}

TEST(EvictingSequenceSlidingWindow, ForkedSequencesCopySharedWindowBlocksBeforeWriting) {
  LlamaModel& model = gemma_model();
  const ModelConfig& c = model.config();
  const int vocab = c.vocab_size;
  const std::vector<TokenId> common = random_tokens(30, vocab, 23);
  const std::vector<TokenId> tail_a = random_tokens(20, vocab, 24);
  const std::vector<TokenId> tail_b = random_tokens(20, vocab, 25);
  for (EvictionPolicy p : {EvictionPolicy::kNone, EvictionPolicy::kStreaming, EvictionPolicy::kH2o}) {
    SCOPED_TRACE(eviction_policy_name(p));
    constexpr int kBlocks = 64;
    KvStorageOptions options;
    keep_local_windows(c.sliding_window, 4, 4, 1, kBlocks, options);  // three sequences at once, and a compaction
    auto storage =
        KvStorage::create({c.num_layers, c.num_kv_heads, c.head_dim, 4}, KvType::kF16, KvType::kF16, kBlocks, options)
            .value();
    ASSERT_LT(storage->num_blocks(0), kBlocks);
    KvCacheManager cache(kBlocks, 4);
    ThreadPool pool(1);
    const EvictionOptions o = p == EvictionPolicy::kNone ? EvictionOptions{} : policy(p, 16);
    auto feed = [&](EvictingSequence& s, std::span<const TokenId> toks) {
      return testing::feed_one_by_one(s, toks, pool);
    };
    {
      EvictingSequence a(model, cache, *storage, o);
      feed(a, std::span(common).first(29));
      auto b = a.fork().value();  // 29 tokens: the shared last block is partly filled
      const std::vector<float> got_a = feed(a, tail_a);
      const std::vector<float> got_b = feed(*b, tail_b);
      EXPECT_GT(a.stats().blocks_copied + b->stats().blocks_copied, 0);
      for (const auto* tail : {&tail_a, &tail_b}) {
        EvictingSequence alone(model, cache, *storage, o);
        feed(alone, std::span(common).first(29));
        EXPECT_EQ(tail == &tail_a ? got_a : got_b, feed(alone, *tail));
      }
    }
    EXPECT_EQ(cache.num_free_blocks(), kBlocks);
    EXPECT_EQ(storage->local_blocks_in_use(), 0);
  }
}

}  // namespace
}  // namespace kvlm
