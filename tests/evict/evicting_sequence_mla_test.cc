// Token eviction on MLA sequences (deepseek2): every policy moves, drops and weighs latent rows
// exactly as it does K/V, against the no-cache oracle that expands every head from the latents
// and sees what the policy left; quantized latents add no error beyond the codec's own.
#include <gtest/gtest.h>

#include <algorithm>

#include "cache/kv_cache_manager.h"
#include "evict/evicting_sequence.h"
#include "kv/kv_storage.h"
#include "model/llama_model.h"
#include "reference/reference_forward.h"
#include "evict_test_util.h"

namespace kvlm {
namespace {

using testing::contiguous_rule;
using testing::random_tokens;

struct MlaRun {
  std::vector<float> logits;               // [n, vocab]
  std::vector<std::vector<int64_t>> live;  // after each decode step
  EvictionStats stats;
  bool pool_full_after = false;
};

MlaRun run_policy(LlamaModel& model, const EvictionOptions& eviction, KvType type, int block_size,
                  std::span<const TokenId> tokens, int prompt_len) {
  const int num_blocks =
      EvictingSequence::max_blocks(eviction, block_size, prompt_len, static_cast<int64_t>(tokens.size()));
  auto storage = KvStorage::create(model.config().kv_layout(block_size), type, type, num_blocks).value();
  KvCacheManager cache(num_blocks, block_size);
  ThreadPool pool(2);
  MlaRun run;
  {
    EvictingSequence seq(model, cache, *storage, eviction);
    std::vector<float> logits;
    EXPECT_TRUE(seq.forward(tokens.first(static_cast<size_t>(prompt_len)), LogitsRows::kAll, pool, logits).ok());
    run.logits = logits;
    for (size_t t = static_cast<size_t>(prompt_len); t < tokens.size(); ++t) {
      const Status s = seq.forward(tokens.subspan(t, 1), LogitsRows::kLast, pool, logits);
      EXPECT_TRUE(s.ok()) << s.message();
      run.logits.insert(run.logits.end(), logits.begin(), logits.end());
      run.live.push_back(seq.live_positions());
      if (eviction.policy != EvictionPolicy::kNone) {
        EXPECT_LE(seq.num_live(), eviction.budget);
      }
    }
    run.stats = seq.stats();
  }
  run.pool_full_after = cache.num_free_blocks() == num_blocks;
  return run;
}

ReferenceVisibility rule_for(const EvictionOptions& o, const MlaRun& run, int prompt) {
  return o.policy == EvictionPolicy::kWindow || o.policy == EvictionPolicy::kStreaming
             ? contiguous_rule(o)
             : testing::recorded_rule(run.live, prompt);
}

double error_vs(const LlamaModel& model, std::span<const TokenId> tokens, const MlaRun& run,
                const ReferenceVisibility& rule) {
  return max_relative_error(run.logits, reference_logits(model.config(), model.weights(), tokens, rule));
}

constexpr EvictionPolicy kPolicies[] = {EvictionPolicy::kWindow, EvictionPolicy::kStreaming, EvictionPolicy::kH2o,
                                        EvictionPolicy::kSnapKv};

TEST(EvictingSequenceMla, EveryPolicyMatchesTheExpandedOracle) {
  LlamaModel& model = testing::eviction_test_model("deepseek2-tiny-moe");
  const std::vector<TokenId> tokens = random_tokens(70, model.config().vocab_size, 21);
  for (EvictionPolicy p : kPolicies) {
    for (int bs : {1, 4, 16}) {
      const EvictionOptions o = testing::test_policy(p, 20);
      const int prompt = p == EvictionPolicy::kH2o ? 20 : 30;
      const MlaRun run = run_policy(model, o, KvType::kF32, bs, tokens, prompt);
      EXPECT_LE(error_vs(model, tokens, run, rule_for(o, run, prompt)), 1e-4)
          << eviction_policy_name(p) << " bs " << bs;
      EXPECT_GT(run.stats.tokens_evicted, 0) << eviction_policy_name(p);
      EXPECT_TRUE(run.pool_full_after) << eviction_policy_name(p);
      if (p == EvictionPolicy::kH2o || p == EvictionPolicy::kSnapKv) {
        EXPECT_GT(run.stats.compactions, 0);
        EXPECT_GT(run.stats.weight_passes, 0);
      }
    }
  }
}

// On a dense model: a MoE router may flip a choice under any perturbation, codec or not.
TEST(EvictingSequenceMla, QuantizedLatentsAddNoErrorBeyondTheCodecsOwn) {
  LlamaModel& model = testing::eviction_test_model("deepseek2-tiny-qlora");
  const std::vector<TokenId> tokens = random_tokens(56, model.config().vocab_size, 22);
  for (KvType type : {KvType::kF16, KvType::kBf16, KvType::kFp8, KvType::kInt8, KvType::kInt4}) {
    const MlaRun full = run_policy(model, testing::test_policy(EvictionPolicy::kNone, 0), type, 16, tokens, 24);
    const double codec_error = error_vs(model, tokens, full, ReferenceVisibility{});
    EXPECT_GT(codec_error, 0.0) << kv_type_name(type);
    for (EvictionPolicy p : kPolicies) {
      const EvictionOptions o = testing::test_policy(p, 20);
      const int prompt = p == EvictionPolicy::kH2o ? 20 : 24;
      const MlaRun run = run_policy(model, o, type, 4, tokens, prompt);
      EXPECT_LE(error_vs(model, tokens, run, rule_for(o, run, prompt)), std::max(3.0 * codec_error, 1e-4))
          << kv_type_name(type) << " " << eviction_policy_name(p) << " (codec alone " << codec_error << ")";
      EXPECT_TRUE(run.pool_full_after);
    }
  }
}

}  // namespace
}  // namespace kvlm
