// --advise: each scenario's pick against a brute-force reading of its rule, and its stated reasons.
#include "plan/kv_advisor.h"

#include <algorithm>
#include <string>
#include <tuple>

#include <fmt/format.h>

#include <gtest/gtest.h>

#include "plan/model_shape.h"

namespace kvlm {
namespace {

Plan make(const char* preset, int64_t ctx, int64_t batch, std::optional<uint64_t> memory) {
  const ModelShape s = *find_preset(preset);
  PlanRequest r;
  r.ctx = ctx;
  r.batch = batch;
  r.block_size = 16;
  r.memory_bytes = memory;
  r.weight_bytes = static_cast<uint64_t>(s.num_params * 2);  // f16 weights
  auto plan = make_plan(s, r);
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return *plan;
}

bool any_contains(const std::vector<std::string>& lines, const std::string& needle) {
  for (const std::string& l : lines) {
    if (l.find(needle) != std::string::npos) return true;
  }
  return false;
}

bool fits(const Plan& plan, const PlanRow& row) { return row.fit->sequences >= plan.request.batch; }

// Quality rank used by the advisor: f32 counts as lossless (16-bit-equivalent).
int rank(const PlanRow& row) {
  return std::max(static_cast<int>(codec_quality(row.option.k_type).tier), static_cast<int>(QualityTier::kLossless));
}

// The reference rule for "least lossy that fits": best rank, then fewest bytes, then smallest error.
std::optional<size_t> least_lossy_fitting(const Plan& plan) {
  std::optional<size_t> best;
  for (size_t i = 1; i < plan.rows.size(); ++i) {
    const PlanRow& r = plan.rows[i];
    if (!fits(plan, r)) continue;
    if (!best) {
      best = i;
      continue;
    }
    const PlanRow& b = plan.rows[*best];
    const auto key = [](const PlanRow& x) {
      return std::make_tuple(rank(x), x.footprint.bytes_per_block, codec_quality(x.option.k_type).relative_rms_error);
    };
    if (key(r) < key(b)) best = i;
  }
  return best;
}

TEST(KvAdvisor, ScenarioNamesRoundTrip) {
  for (Scenario s : {Scenario::kLimitedMemory, Scenario::kLongChat, Scenario::kLongRecall, Scenario::kConcurrency}) {
    EXPECT_EQ(parse_scenario(scenario_name(s)), s);
  }
  EXPECT_FALSE(parse_scenario("fast").has_value());
  EXPECT_EQ(scenario_list(), "limited-memory, long-chat, long-recall, concurrency");
}

TEST(KvAdvisor, CodecQualityFromBits) {
  EXPECT_EQ(codec_quality(KvType::kF32).bits_per_value, 32.0);
  EXPECT_EQ(codec_quality(KvType::kF32).tier, QualityTier::kExact);
  EXPECT_EQ(codec_quality(KvType::kF16).bits_per_value, 16.0);
  EXPECT_EQ(codec_quality(KvType::kF16).tier, QualityTier::kLossless);
  EXPECT_EQ(codec_quality(KvType::kF32).relative_rms_error, 0.0);
  EXPECT_GT(codec_quality(KvType::kF16).relative_rms_error, 0.0);
  EXPECT_LT(codec_quality(KvType::kF16).relative_rms_error, 1e-3);  // 2^-11 relative rounding
  // Every codec: fewer bits never measure as more accurate than a codec with twice the bits.
  for (KvType a : all_kv_types()) {
    for (KvType b : all_kv_types()) {
      const CodecQuality qa = codec_quality(a), qb = codec_quality(b);
      if (qa.bits_per_value >= 2 * qb.bits_per_value) {
        EXPECT_LE(qa.relative_rms_error, qb.relative_rms_error) << kv_type_name(a) << " vs " << kv_type_name(b);
      }
    }
  }
}

// Plenty of memory: f16 fits, nothing is quantized, and f32 is not preferred for its bits.
TEST(KvAdvisor, LimitedMemoryKeepsF16WhenItFits) {
  const Plan plan = make("llama-3-8b", 8192, 1, uint64_t{24} << 30);
  auto a = advise(plan, Scenario::kLimitedMemory);
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_TRUE(a->chosen_row.has_value());
  EXPECT_EQ(plan.rows[*a->chosen_row].option.k_type, KvType::kF16);
  EXPECT_EQ(a->chosen_row, least_lossy_fitting(plan));
  EXPECT_TRUE(any_contains(a->reasons, "no need to quantize"));
  EXPECT_TRUE(any_contains(a->reasons, "128.00 KiB/token"));  // 131,072 B per token
  EXPECT_NE(a->recommendation.find("--kv-type f16"), std::string::npos) << a->recommendation;
}

// 17 GB for an 8B model at f16: 0.94 GB left, f16 needs 1.07 GB. The pick (if this build
// has a smaller codec) is the least lossy one that fits; else nothing, with the missing codecs named.
TEST(KvAdvisor, LimitedMemoryQuantizesWhenF16DoesNotFit) {
  const Plan plan = make("llama-3-8b", 8192, 1, uint64_t{17000000000});
  for (const PlanRow& r : plan.rows) {
    if (!r.is_baseline && codec_quality(r.option.k_type).bits_per_value >= 16) {
      EXPECT_FALSE(fits(plan, r));
    }
  }
  auto a = advise(plan, Scenario::kLimitedMemory);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->chosen_row, least_lossy_fitting(plan));
  EXPECT_TRUE(any_contains(a->reasons, "quantizing the cache is the safest first step"));
  EXPECT_TRUE(any_contains(a->reasons, "does not fit"));
  if (!a->chosen_row) {
    EXPECT_TRUE(any_contains(a->not_available, "8-bit"));
    EXPECT_NE(a->recommendation.find("nothing fits"), std::string::npos);
  }
}

TEST(KvAdvisor, LimitedMemoryNeedsMemory) {
  const Plan plan = make("llama-3-8b", 8192, 1, std::nullopt);
  auto a = advise(plan, Scenario::kLimitedMemory);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("--memory"), std::string::npos);
}

PlanRequest request_for(const ModelShape& s, int64_t ctx, int64_t batch, std::optional<uint64_t> memory) {
  PlanRequest r;
  r.ctx = ctx;
  r.batch = batch;
  r.block_size = 16;
  r.memory_bytes = memory;
  r.weight_bytes = static_cast<uint64_t>(s.num_params * 2);  // f16 weights
  return r;
}

Plan advice_plan(const char* preset, int64_t ctx, int64_t batch, std::optional<uint64_t> memory, Scenario scenario) {
  const ModelShape s = *find_preset(preset);
  auto plan = make_advice_plan(s, request_for(s, ctx, batch, memory), scenario);
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return *plan;
}

// No advice says eviction is missing any more.
void expect_no_not_implemented(const Advice& a) {
  EXPECT_FALSE(any_contains(a.reasons, "not implemented"));
  EXPECT_FALSE(any_contains(a.not_available, "not implemented"));
  EXPECT_EQ(a.recommendation.find("not implemented"), std::string::npos);
}

// llama-3-8b (trained on 8192) chatting for 131072 tokens in 24 GiB: streaming at the trained
// context in f16, 512 + 2 blocks of 2 MiB per sequence instead of 16 GiB.
TEST(KvAdvisor, LongChatPicksStreamingAtTheTrainedContext) {
  const Plan plan = advice_plan("llama-3-8b", 131072, 1, uint64_t{24} << 30, Scenario::kLongChat);
  ASSERT_EQ(plan.request.evictions.size(), 1u);
  EXPECT_EQ(plan.request.evictions[0].policy, "streaming");
  EXPECT_EQ(plan.request.evictions[0].budget, 8192);
  EXPECT_EQ(plan.request.evictions[0].sinks, kAdviceSinks);
  auto a = advise(plan, Scenario::kLongChat);
  ASSERT_TRUE(a.ok()) << a.status().message();
  expect_no_not_implemented(*a);
  ASSERT_TRUE(a->chosen_row.has_value());
  const PlanRow& row = plan.rows[*a->chosen_row];
  EXPECT_EQ(row.option.policy, "streaming");
  EXPECT_EQ(row.option.k_type, KvType::kF16);
  EXPECT_EQ(row.tokens_per_sequence, 8192);
  EXPECT_EQ(row.blocks_per_sequence, 514);
  EXPECT_EQ(row.block_bytes_total, 514u * 2097152);
  // 9,709,803,776 B after 16.06e9 B of weights: 9 whole sequences of 514 blocks (1,077,936,128 B).
  ASSERT_TRUE(row.fit.has_value());
  EXPECT_EQ(row.fit->sequences, 9);
  EXPECT_TRUE(any_contains(a->reasons, "StreamingLLM keeps 4 attention sinks + the 8188 most recent tokens"));
  EXPECT_TRUE(any_contains(a->reasons, "514 blocks (1.00 GiB) per sequence from token 8192 on"));
  EXPECT_TRUE(any_contains(a->reasons, "16.00 GiB per sequence at 131072 tokens"));
  EXPECT_TRUE(any_contains(a->reasons, "9 sequences of 8192 resident tokens"));
  EXPECT_TRUE(any_contains(a->reasons, "the chat can run past it"));
  EXPECT_NE(a->recommendation.find("--kv-type f16 --policy streaming --budget 8192 --sinks 4"), std::string::npos)
      << a->recommendation;
}

// Little memory: the budget shrinks to what the smallest 8-bit codec fits, and the pick fits.
TEST(KvAdvisor, LongChatBudgetShrinksToWhatFits) {
  const ModelShape s = *find_preset("llama-3-8b");
  const uint64_t memory = static_cast<uint64_t>(s.num_params * 2) + 100'000'000;  // 100 MB for the cache
  const Plan plan = advice_plan("llama-3-8b", 131072, 1, memory, Scenario::kLongChat);
  ASSERT_EQ(plan.request.evictions.size(), 1u);
  const int64_t budget = plan.request.evictions[0].budget;
  EXPECT_LT(budget, 8192);
  EXPECT_GT(budget, 0);
  EXPECT_EQ(budget % 16, 0);
  auto a = advise(plan, Scenario::kLongChat);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(a->chosen_row.has_value());
  const PlanRow& row = plan.rows[*a->chosen_row];
  EXPECT_EQ(row.option.policy, "streaming");
  EXPECT_TRUE(fits(plan, row));
  EXPECT_LE(codec_quality(row.option.k_type).tier, QualityTier::kNearLossless);
  // One more block per sequence would not have fit with that codec.
  EXPECT_LT(row.fit->available_bytes, (row.blocks_per_sequence + 1) * row.footprint.bytes_per_block);
}

// A plan made without streaming rows (make_plan, no --policy): the full cache, and how to get streaming.
TEST(KvAdvisor, LongChatWithoutStreamingRowsFallsBackToFullCache) {
  const Plan plan = make("llama-3.2-1b", 131072, 1, uint64_t{24} << 30);
  auto a = advise(plan, Scenario::kLongChat);
  ASSERT_TRUE(a.ok());
  expect_no_not_implemented(*a);
  EXPECT_TRUE(any_contains(a->not_available, "--policy streaming --budget N"));
  ASSERT_TRUE(a->chosen_row.has_value());
  EXPECT_FALSE(plan.rows[*a->chosen_row].option.evicts());
  EXPECT_EQ(a->chosen_row, least_lossy_fitting(plan));
  // 16 layers × 8 heads × 64 × 2 × 2 B = 32 KiB per token; 4 GiB at 131,072 tokens.
  EXPECT_TRUE(any_contains(a->reasons, "32.00 KiB per token"));
  EXPECT_TRUE(any_contains(a->reasons, "4.00 GiB per sequence at 131072 tokens"));
}

// Recall never takes an evicting row, even when the plan lists them and they are smaller.
TEST(KvAdvisor, LongRecallRefusesEvictionAndPrefersQuantization) {
  const ModelShape s = *find_preset("llama-3-8b");
  PlanRequest r = request_for(s, 8192, 1, static_cast<uint64_t>(s.num_params * 2) + 700'000'000);
  PlanEviction streaming;
  streaming.policy = "streaming";
  streaming.budget = 1024;
  r.evictions = {streaming};
  auto plan = make_advice_plan(s, r, Scenario::kLongRecall);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->request.evictions.size(), 1u);  // nothing added for recall
  auto a = advise(*plan, Scenario::kLongRecall);
  ASSERT_TRUE(a.ok());
  expect_no_not_implemented(*a);
  ASSERT_TRUE(a->chosen_row.has_value());
  const PlanRow& row = plan->rows[*a->chosen_row];
  EXPECT_FALSE(row.option.evicts());
  // f16 needs 1 GiB at 8192 tokens: a quantized full cache is chosen, not f16 + streaming 1024.
  EXPECT_NE(row.option.k_type, KvType::kF16);
  EXPECT_TRUE(fits(*plan, row));
  EXPECT_TRUE(any_contains(a->reasons, "evicted details are gone"));
  EXPECT_TRUE(any_contains(a->reasons, "accuracy falls to the control"));
  EXPECT_TRUE(any_contains(a->reasons, "evicting rows are not considered"));
}

// Less memory than any full cache of 8192 tokens needs: a codec of 8+ bits with streaming.
TEST(KvAdvisor, LimitedMemoryCombinesCodecAndStreamingWhenNoFullCacheFits) {
  const ModelShape s = *find_preset("llama-3-8b");
  const uint64_t memory = static_cast<uint64_t>(s.num_params * 2) + 100'000'000;
  const Plan plan = advice_plan("llama-3-8b", 8192, 1, memory, Scenario::kLimitedMemory);
  for (const PlanRow& r : plan.rows) {
    if (!r.is_baseline && !r.option.evicts()) {
      EXPECT_FALSE(fits(plan, r)) << r.option.label;
    }
  }
  ASSERT_EQ(plan.request.evictions.size(), 1u);
  auto a = advise(plan, Scenario::kLimitedMemory);
  ASSERT_TRUE(a.ok()) << a.status().message();
  expect_no_not_implemented(*a);
  ASSERT_TRUE(a->chosen_row.has_value());
  const PlanRow& row = plan.rows[*a->chosen_row];
  EXPECT_EQ(row.option.policy, "streaming");
  EXPECT_EQ(row.option.k_type, KvType::kInt8);  // the least lossy that fits: 8-bit, smaller error than fp8
  EXPECT_TRUE(fits(plan, row));
  EXPECT_TRUE(any_contains(a->reasons, "no full cache fits"));
  EXPECT_TRUE(any_contains(a->reasons, "forgets every token outside its budget"));
  EXPECT_NE(a->recommendation.find(fmt::format("--kv-type int8 --policy streaming --budget {}",
                                               row.option.token_budget)),
            std::string::npos)
      << a->recommendation;
  EXPECT_NE(a->recommendation.find(fmt::format("int8 + streaming {}", row.option.token_budget)), std::string::npos);

  // 19 MiB for llama-2-7b's cache: a window under 256 tokens is not recommended; nothing fits.
  const ModelShape l2 = *find_preset("llama-2-7b");
  const Plan tiny = advice_plan("llama-2-7b", 8192, 1, static_cast<uint64_t>(l2.num_params * 2) + 20'000'000,
                                Scenario::kLimitedMemory);
  EXPECT_TRUE(tiny.request.evictions.empty());
  auto t = advise(tiny, Scenario::kLimitedMemory);
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->chosen_row.has_value());
  EXPECT_NE(t->recommendation.find("nothing fits"), std::string::npos);
  EXPECT_TRUE(any_contains(t->reasons, "--policy streaming --budget N"));

  // When a full cache fits, no streaming rows are added and none is picked.
  const Plan roomy = advice_plan("llama-3-8b", 8192, 1, uint64_t{24} << 30, Scenario::kLimitedMemory);
  EXPECT_TRUE(roomy.request.evictions.empty());
}

TEST(KvAdvisor, ConcurrencyUsesStreamingOnlyWhenNoFullCacheReachesTheTarget) {
  const ModelShape s = *find_preset("llama-3-8b");
  const uint64_t memory = static_cast<uint64_t>(s.num_params * 2) + 2'000'000'000;
  const Plan plan = advice_plan("llama-3-8b", 8192, 64, memory, Scenario::kConcurrency);
  ASSERT_EQ(plan.request.evictions.size(), 1u);
  auto a = advise(plan, Scenario::kConcurrency);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(a->chosen_row.has_value());
  const PlanRow& row = plan.rows[*a->chosen_row];
  EXPECT_TRUE(row.option.evicts());
  EXPECT_GE(row.fit->sequences, 64);
  EXPECT_LE(codec_quality(row.option.k_type).tier, QualityTier::kNearLossless);
  EXPECT_TRUE(any_contains(a->reasons, "no full cache reaches 64 sequences"));
}

TEST(KvAdvisor, LongRecallNeverEvictsAndExplainsArchitecture) {
  const Plan gqa = make("llama-3-8b", 8192, 2, uint64_t{40} << 30);
  auto a = advise(gqa, Scenario::kLongRecall);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(a->chosen_row.has_value());
  EXPECT_FALSE(gqa.rows[*a->chosen_row].option.evicts());
  EXPECT_EQ(a->chosen_row, least_lossy_fitting(gqa));
  EXPECT_TRUE(any_contains(a->reasons, "must not evict"));
  expect_no_not_implemented(*a);
  EXPECT_TRUE(any_contains(a->reasons, "GQA: this model stores 8 K/V heads for 32 query heads, 4× less"));

  const Plan mha = make("llama-2-7b", 4096, 1, std::nullopt);
  auto m = advise(mha, Scenario::kLongRecall);
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(any_contains(m->reasons, "this model is MHA"));
  EXPECT_TRUE(any_contains(m->reasons, "128.00 KiB/token in f16 (4× less)"));

  const Plan mla = make("deepseek-v2-lite", 32768, 1, std::nullopt);
  auto d = advise(mla, Scenario::kLongRecall);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(d->chosen_row.has_value());
  EXPECT_EQ(mla.rows[*d->chosen_row].option.form, CacheForm::kLatent);
  EXPECT_TRUE(any_contains(d->reasons, "MLA: each layer stores one latent of 576 values"));
}

// 80 GiB, 16 sequences of 8192 for llama-3-8b: the smallest option of 8+ bits that reaches the target.
TEST(KvAdvisor, ConcurrencyPicksSmallestOptionMeetingTheBar) {
  const Plan plan = make("llama-3-8b", 8192, 16, uint64_t{80} << 30);
  auto a = advise(plan, Scenario::kConcurrency);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(a->chosen_row.has_value());
  const PlanRow& chosen = plan.rows[*a->chosen_row];
  EXPECT_GE(chosen.fit->sequences, 16);
  for (size_t i = 1; i < plan.rows.size(); ++i) {
    const PlanRow& r = plan.rows[i];
    if (codec_quality(r.option.k_type).tier <= QualityTier::kNearLossless) {
      EXPECT_LE(chosen.footprint.bytes_per_block, r.footprint.bytes_per_block) << r.option.label;
    }
  }
  EXPECT_TRUE(any_contains(a->reasons, "blocks of 16 tokens"));
  EXPECT_TRUE(any_contains(a->reasons, fmt::format("{} sequences of 8192 tokens", chosen.fit->sequences)));

  // An impossible target: nothing chosen, the numbers say how far it is.
  const Plan huge = make("llama-2-7b", 4096, 100000, uint64_t{24} << 30);
  auto h = advise(huge, Scenario::kConcurrency);
  ASSERT_TRUE(h.ok());
  EXPECT_FALSE(h->chosen_row.has_value());
  EXPECT_TRUE(any_contains(h->reasons, "target of 100000 sequences"));
}

}  // namespace
}  // namespace kvlm
