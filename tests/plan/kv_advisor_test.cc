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
    if (!r.is_baseline && codec_quality(r.option.k_type).bits_per_value >= 16) EXPECT_FALSE(fits(plan, r));
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

TEST(KvAdvisor, LongChatSaysStreamingIsMissingAndFallsBackToFullCache) {
  const Plan plan = make("llama-3.2-1b", 131072, 1, uint64_t{24} << 30);
  auto a = advise(plan, Scenario::kLongChat);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(any_contains(a->not_available, "StreamingLLM"));
  EXPECT_TRUE(any_contains(a->not_available, "not implemented"));
  ASSERT_TRUE(a->chosen_row.has_value());
  const PlanRow& row = plan.rows[*a->chosen_row];
  EXPECT_FALSE(row.option.evicts());
  EXPECT_EQ(a->chosen_row, least_lossy_fitting(plan));
  // 16 layers × 8 heads × 64 × 2 × 2 B = 32 KiB per token; 4 GiB at 131,072 tokens.
  EXPECT_TRUE(any_contains(a->reasons, "32.00 KiB per token"));
  EXPECT_TRUE(any_contains(a->reasons, "4.00 GiB per sequence at 131072 tokens"));
}

TEST(KvAdvisor, LongRecallNeverEvictsAndExplainsArchitecture) {
  const Plan gqa = make("llama-3-8b", 8192, 2, uint64_t{40} << 30);
  auto a = advise(gqa, Scenario::kLongRecall);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(a->chosen_row.has_value());
  EXPECT_FALSE(gqa.rows[*a->chosen_row].option.evicts());
  EXPECT_EQ(a->chosen_row, least_lossy_fitting(gqa));
  EXPECT_TRUE(any_contains(a->reasons, "must not evict"));
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
