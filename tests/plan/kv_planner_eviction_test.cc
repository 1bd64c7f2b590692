// The planner's rows under token eviction: resident tokens, whole blocks with the policy's extra
// ones, memory fit, and the block rule against EvictingSequence's own.
#include <vector>

#include <gtest/gtest.h>

#include "evict/evicting_sequence.h"
#include "evict/eviction_options.h"
#include "kv/kv_codec.h"
#include "plan/kv_planner.h"
#include "plan/model_shape.h"

namespace kvlm {
namespace {

PlanEviction eviction(const char* policy, int64_t budget) {
  PlanEviction e;
  e.policy = policy;
  e.budget = budget;
  return e;
}

Plan plan_with(const char* preset, int64_t ctx, std::vector<PlanEviction> evictions, int64_t batch = 1) {
  PlanRequest r;
  r.ctx = ctx;
  r.batch = batch;
  r.block_size = 16;
  r.evictions = std::move(evictions);
  auto plan = make_plan(*find_preset(preset), r);
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return plan.ok() ? *plan : Plan{};
}

const PlanRow* find_row(const Plan& plan, KvType type, const std::string& policy) {
  for (const PlanRow& r : plan.rows) {
    if (!r.is_baseline && r.option.k_type == type && r.option.policy == policy) return &r;
  }
  ADD_FAILURE() << "no row " << kv_type_name(type) << " " << policy;
  return nullptr;
}

// llama-3-8b in f16: 32 layers × 8 kv heads × 128 × 2 (K, V) × 2 B = 131,072 B/token, so a
// 16-token block is 2,097,152 B. At ctx 32768 the full cache holds 2048 blocks.
constexpr uint64_t kF16Block = 2097152;

TEST(KvPlannerEviction, StreamingAtBudget4096HoldsItsBudgetPlusTwoBlocks) {
  const Plan plan = plan_with("llama-3-8b", 32768, {eviction("streaming", 4096)});
  // The baseline, one full row per codec, one streaming row per codec.
  ASSERT_EQ(plan.rows.size(), 1 + 2 * all_kv_types().size());
  const PlanRow* full = find_row(plan, KvType::kF16, "full");
  const PlanRow* streaming = find_row(plan, KvType::kF16, "streaming");
  ASSERT_TRUE(full && streaming);
  EXPECT_EQ(full->tokens_per_sequence, 32768);
  EXPECT_EQ(full->blocks_per_sequence, 2048);
  EXPECT_EQ(full->block_bytes_total, 2048 * kF16Block);  // 4 GiB

  EXPECT_EQ(streaming->option.label, "f16 + streaming 4096");
  EXPECT_EQ(streaming->option.sinks, 4);
  EXPECT_EQ(streaming->tokens_per_sequence, 4096);
  EXPECT_EQ(streaming->blocks_per_sequence, 256 + 2);
  EXPECT_EQ(streaming->policy_extra_blocks, 2);
  EXPECT_EQ(streaming->block_bytes_total, 258 * kF16Block);  // 541,065,216 B
  EXPECT_EQ(streaming->block_bytes_total, 541065216u);
  EXPECT_EQ(streaming->formula_bytes, 4096.0 * 131072);
  EXPECT_EQ(streaming->footprint.bytes_per_block, kF16Block);
  EXPECT_DOUBLE_EQ(streaming->ratio_to_baseline, 0.25);  // per token: the codec's, unchanged
}

TEST(KvPlannerEviction, EveryCodecGetsThePolicyRowWithItsOwnBlockBytes) {
  const Plan plan = plan_with("llama-3-8b", 32768, {eviction("window", 4096)}, /*batch=*/3);
  for (KvType type : all_kv_types()) {
    const PlanRow* full = find_row(plan, type, "full");
    const PlanRow* window = find_row(plan, type, "window");
    ASSERT_TRUE(full && window);
    EXPECT_EQ(window->footprint.bytes_per_block, full->footprint.bytes_per_block) << kv_type_name(type);
    const KvLayout layout{32, 8, 128, 16};
    EXPECT_EQ(window->footprint.bytes_per_block, 32 * kv_block_bytes(layout, type, type));
    // KIVI keeps its f32 staging (tail + residual blocks) per sequence either way.
    EXPECT_EQ(window->block_bytes_total,
              (258 * window->footprint.bytes_per_block + window->staging_bytes_per_sequence) * 3)
        << kv_type_name(type);
    EXPECT_EQ(window->tokens_per_sequence, 4096);
  }
}

TEST(KvPlannerEviction, H2oAndSnapKvBlocks) {
  const Plan plan = plan_with("llama-3-8b", 32768, {eviction("h2o", 4096), eviction("snapkv", 4096)});
  ASSERT_EQ(plan.rows.size(), 1 + 3 * all_kv_types().size());
  const PlanRow* h2o = find_row(plan, KvType::kF16, "h2o");
  ASSERT_TRUE(h2o);
  // Survivors are compacted: ceil(4096 / 16) blocks, nothing extra.
  EXPECT_EQ(h2o->blocks_per_sequence, 256);
  EXPECT_EQ(h2o->policy_extra_blocks, 0);
  EXPECT_EQ(h2o->block_bytes_total, 256 * kF16Block);

  // SnapKV runs a prompt step (assumed the budget) whole before compressing: 8192 tokens at the peak.
  const PlanRow* snapkv = find_row(plan, KvType::kF16, "snapkv");
  ASSERT_TRUE(snapkv);
  EXPECT_EQ(snapkv->tokens_per_sequence, 4096);
  EXPECT_EQ(snapkv->blocks_per_sequence, 512);
  EXPECT_EQ(snapkv->policy_extra_blocks, 256);
  EXPECT_EQ(snapkv->block_bytes_total, 512 * kF16Block);

  // A longer prompt step peaks higher; never above the whole text.
  KvOption o = snapkv->option;
  o.prompt_step_tokens = 10000;
  EXPECT_EQ(o.peak_tokens(32768), 14096);
  EXPECT_EQ(o.blocks_per_sequence(32768, 16), 881);  // ceil(14096 / 16)
  EXPECT_EQ(o.peak_tokens(6000), 6000);
}

// Below the budget nothing is evicted: the policy rows equal the full cache.
TEST(KvPlannerEviction, WithinTheBudgetNothingExtra) {
  const Plan plan = plan_with("llama-3-8b", 1000, {eviction("streaming", 4096)});
  const PlanRow* full = find_row(plan, KvType::kF16, "full");
  const PlanRow* streaming = find_row(plan, KvType::kF16, "streaming");
  ASSERT_TRUE(full && streaming);
  EXPECT_EQ(streaming->tokens_per_sequence, 1000);
  EXPECT_EQ(streaming->blocks_per_sequence, 63);  // ceil(1000 / 16)
  EXPECT_EQ(streaming->policy_extra_blocks, 0);
  EXPECT_EQ(streaming->block_bytes_total, full->block_bytes_total);

  // One token past it: the evicted slot may linger, two blocks at most.
  const Plan past = plan_with("llama-3-8b", 4097, {eviction("streaming", 4096)});
  EXPECT_EQ(find_row(past, KvType::kF16, "streaming")->blocks_per_sequence, 258);
  EXPECT_EQ(find_row(past, KvType::kF16, "full")->blocks_per_sequence, 257);
}

// The sequences that fit count whole blocks including the extra ones.
TEST(KvPlannerEviction, MemoryFitUsesBlocksPerSequence) {
  PlanRequest r;
  r.ctx = 32768;
  r.block_size = 16;
  r.memory_bytes = 1000 * kF16Block + 5;
  r.weight_bytes = 0;
  r.evictions = {eviction("streaming", 4096)};
  auto plan = make_plan(*find_preset("llama-3-8b"), r);
  ASSERT_TRUE(plan.ok());
  const PlanRow* streaming = find_row(*plan, KvType::kF16, "streaming");
  ASSERT_TRUE(streaming && streaming->fit);
  EXPECT_EQ(streaming->fit->sequences, 3);  // 1000 / 258
  EXPECT_EQ(streaming->fit->tokens, 16000);
  EXPECT_EQ(find_row(*plan, KvType::kF16, "full")->fit->sequences, 0);  // 2048 blocks each

  FitQuery query;
  query.memory_bytes = 1000 * kF16Block;
  query.blocks.global = 258;
  const MemoryFit direct = compute_fit(*find_preset("llama-3-8b"), streaming->footprint, query);
  EXPECT_EQ(direct.sequences, 3);
}

// The planner's rule and EvictingSequence's must agree for every policy.
TEST(KvPlannerEviction, EvictedSlotBlocksAgreeWithEvictingSequence) {
  for (EvictionPolicy policy : all_eviction_policies()) {
    if (policy == EvictionPolicy::kNone) continue;
    EvictionOptions options;
    options.policy = policy;
    options.budget = 64;
    EXPECT_EQ(evicted_slot_blocks(eviction_policy_name(policy)), EvictingSequence::evicted_slot_blocks(options))
        << eviction_policy_name(policy);
    // Every policy the evict module knows is one the planner accepts.
    EXPECT_TRUE(validate_plan_eviction(eviction(eviction_policy_name(policy), 64)).ok());
  }
  // And the planner's peak never exceeds what EvictingSequence reserves per sequence.
  for (EvictionPolicy policy : all_eviction_policies()) {
    if (policy == EvictionPolicy::kNone) continue;
    EvictionOptions options;
    options.policy = policy;
    options.budget = 200;
    const Plan plan = plan_with("llama-3.2-1b", 5000, {eviction(eviction_policy_name(policy), 200)});
    const PlanRow* row = find_row(plan, KvType::kF16, eviction_policy_name(policy));
    ASSERT_TRUE(row);
    EXPECT_LE(row->blocks_per_sequence, EvictingSequence::max_blocks(options, 16, 200, 5000))
        << eviction_policy_name(policy);
  }
}

TEST(KvPlannerEviction, RejectsBadEvictions) {
  PlanRequest r;
  r.ctx = 100;
  r.block_size = 16;
  const ModelShape s = *find_preset("llama-3-8b");
  const auto message = [&](PlanEviction e) {
    r.evictions = {e};
    auto p = make_plan(s, r);
    EXPECT_FALSE(p.ok());
    return p.ok() ? std::string() : p.status().message();
  };
  EXPECT_NE(message(eviction("lru", 10)).find("unknown eviction policy 'lru'"), std::string::npos);
  EXPECT_NE(message(eviction("none", 10)).find("unknown eviction policy 'none'"), std::string::npos);
  EXPECT_NE(message(eviction("window", 0)).find("needs --budget"), std::string::npos);
  PlanEviction sinks = eviction("streaming", 4);
  sinks.sinks = 4;
  EXPECT_NE(message(sinks).find("--sinks 4 must be in [0, --budget 4)"), std::string::npos);
  EXPECT_EQ(plan_policy_list(), "window, streaming, h2o, snapkv");
}

}  // namespace
}  // namespace kvlm
