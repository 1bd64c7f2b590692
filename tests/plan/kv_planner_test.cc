// The planner's formulas against hand-computed cases (the seed's worked numbers) and the live cache.
#include "plan/kv_planner.h"

#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "cache/kv_cache_manager.h"
#include "kv/kv_codec.h"
#include "kv/kv_storage.h"
#include "plan/model_shape.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

ModelShape preset_or_die(const char* name) {
  auto shape = find_preset(name);
  EXPECT_TRUE(shape.ok()) << shape.status().message();
  return *shape;
}

const PlanRow& row_for(const Plan& plan, KvType type) {
  for (const PlanRow& r : plan.rows) {
    if (!r.is_baseline && r.option.k_type == type) return r;
  }
  ADD_FAILURE() << "no row for " << kv_type_name(type);
  return plan.rows.front();
}

PlanRequest request(int64_t ctx, int64_t batch = 1) {
  PlanRequest r;
  r.ctx = ctx;
  r.batch = batch;
  r.block_size = 16;
  return r;
}

// Seed: 32 layers × 32 heads × 128 dims × 2 (K and V) × 2 bytes = 524,288 bytes per token.
TEST(KvPlanner, Llama2FullCacheIs524288BytesPerToken) {
  const ModelShape s = preset_or_die("llama-2-7b");
  EXPECT_EQ(mha_f16_bytes_per_token(s), 524288.0);
  auto f16 = kv_footprint(s, KvType::kF16, KvType::kF16, CacheForm::kFull, 16);
  ASSERT_TRUE(f16.ok()) << f16.status().message();
  EXPECT_EQ(f16->bytes_per_token(), 524288.0);
  EXPECT_EQ(f16->bytes_per_block, 524288u * 16);
  EXPECT_EQ(f16->k_block_bytes, 32u * 128 * 2 * 16);  // one layer: 32 heads × 128 × 2 B × 16 tokens
  auto f32 = kv_footprint(s, KvType::kF32, KvType::kF32, CacheForm::kFull, 16);
  ASSERT_TRUE(f32.ok());
  EXPECT_EQ(f32->bytes_per_token(), 2 * 524288.0);
}

// Seed: ≈2 GB at 4,000 tokens and ≈50 GB at 100,000 tokens.
TEST(KvPlanner, Llama2TotalsAt4000And100000Tokens) {
  const ModelShape s = preset_or_die("llama-2-7b");
  auto p4k = make_plan(s, request(4000));
  ASSERT_TRUE(p4k.ok()) << p4k.status().message();
  const PlanRow& base = p4k->rows.front();
  ASSERT_TRUE(base.is_baseline);
  EXPECT_EQ(base.formula_bytes, 2097152000.0);
  EXPECT_EQ(base.block_bytes_total, 2097152000u);  // 4000 = 250 whole blocks
  EXPECT_EQ(row_for(*p4k, KvType::kF16).formula_bytes, 2097152000.0);
  EXPECT_DOUBLE_EQ(row_for(*p4k, KvType::kF16).ratio_to_baseline, 1.0);
  EXPECT_DOUBLE_EQ(row_for(*p4k, KvType::kF32).ratio_to_baseline, 2.0);

  auto p100k = make_plan(s, request(100000));
  ASSERT_TRUE(p100k.ok());
  EXPECT_EQ(row_for(*p100k, KvType::kF16).formula_bytes, 52428800000.0);  // 52.4e9 B
  EXPECT_EQ(row_for(*p100k, KvType::kF16).block_bytes_total, 52428800000u);

  // Not a multiple of the block size: the formula is exact, the total rounds up to whole blocks.
  auto p17 = make_plan(s, request(17, 3));
  ASSERT_TRUE(p17.ok());
  EXPECT_EQ(row_for(*p17, KvType::kF16).formula_bytes, 17.0 * 3 * 524288);
  EXPECT_EQ(row_for(*p17, KvType::kF16).block_bytes_total, 2u * 16 * 3 * 524288);
}

// Seed: GQA with 8 kv heads for 32 query heads stores a quarter.
TEST(KvPlanner, GqaQuartersTheCache) {
  const ModelShape s = preset_or_die("llama-3-8b");
  auto plan = make_plan(s, request(8192));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->baseline_bytes_per_token, 524288.0);
  EXPECT_EQ(row_for(*plan, KvType::kF16).footprint.bytes_per_token(), 131072.0);
  EXPECT_DOUBLE_EQ(row_for(*plan, KvType::kF16).ratio_to_baseline, 0.25);

  const ModelShape small = preset_or_die("llama-3.2-1b");  // 16 × 8 × 64 × 2 × 2
  auto f16 = kv_footprint(small, KvType::kF16, KvType::kF16, CacheForm::kFull, 16);
  ASSERT_TRUE(f16.ok());
  EXPECT_EQ(f16->bytes_per_token(), 32768.0);
}

// Seed: per layer and token, MHA with 32 heads × 128 dims stores 2 × 32 × 128 = 8,192 values
// where a 512-dim latent stores 512 (16×), 576 with the 64 rope dims.
TEST(KvPlanner, MlaLatentAgainstMha) {
  ModelShape s;
  s.name = "one-layer-mla";
  s.num_layers = 1;
  s.num_heads = 32;
  s.num_kv_heads = 32;
  s.head_dim = 128;
  s.v_head_dim = 128;
  s.context_length = 4096;
  s.kv_lora_rank = 512;
  EXPECT_EQ(mha_f16_bytes_per_token(s), 8192.0 * 2);
  auto latent = kv_footprint(s, KvType::kF16, KvType::kF16, CacheForm::kLatent, 16);
  ASSERT_TRUE(latent.ok()) << latent.status().message();
  EXPECT_EQ(latent->bytes_per_token(), 512.0 * 2);
  EXPECT_EQ(latent->v_block_bytes, 0u);
  EXPECT_EQ(mha_f16_bytes_per_token(s) / latent->bytes_per_token(), 16.0);

  s.rope_head_dim = 64;
  latent = kv_footprint(s, KvType::kF16, KvType::kF16, CacheForm::kLatent, 16);
  ASSERT_TRUE(latent.ok());
  EXPECT_EQ(latent->bytes_per_token(), 576.0 * 2);

  // A non-MLA shape has no latent.
  EXPECT_FALSE(kv_footprint(preset_or_die("llama-2-7b"), KvType::kF16, KvType::kF16, CacheForm::kLatent, 16).ok());
}

TEST(KvPlanner, DeepseekPresetsListLatentRows) {
  const ModelShape lite = preset_or_die("deepseek-v2-lite");
  auto plan = make_plan(lite, request(lite.context_length));
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  // Baseline: 27 layers × 16 heads × (192 K + 128 V) × 2 B.
  EXPECT_EQ(plan->baseline_bytes_per_token, 27.0 * 16 * 320 * 2);
  ASSERT_EQ(plan->rows.size(), 1 + all_kv_types().size());
  for (size_t i = 1; i < plan->rows.size(); ++i) EXPECT_EQ(plan->rows[i].option.form, CacheForm::kLatent);
  const PlanRow& f16 = row_for(*plan, KvType::kF16);
  EXPECT_EQ(f16.footprint.bytes_per_token(), 27.0 * 576 * 2);  // 31,104 B
  EXPECT_NEAR(f16.ratio_to_baseline, 576.0 / (16 * 320), 1e-12);

  const ModelShape v2 = preset_or_die("deepseek-v2");
  auto f = kv_footprint(v2, KvType::kF16, KvType::kF16, CacheForm::kLatent, 16);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->bytes_per_token(), 60.0 * 576 * 2);
}

// Every codec of the build appears exactly once, with the codec's own block bytes.
TEST(KvPlanner, OneRowPerCodecWithTheCodecsBytes) {
  const ModelShape s = preset_or_die("llama-3-8b");
  auto plan = make_plan(s, request(1000));
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->rows.size(), 1 + all_kv_types().size());
  size_t i = 1;
  for (KvType type : all_kv_types()) {
    const PlanRow& r = plan->rows[i++];
    EXPECT_EQ(r.option.k_type, type);
    EXPECT_FALSE(r.option.evicts());
    const KvLayout layout{32, 8, 128, 16};
    EXPECT_EQ(r.footprint.bytes_per_block, 32 * kv_block_bytes(layout, type, type));
  }
}

// stories260K: the planner's numbers from the GGUF equal what KvStorage allocates.
TEST(KvPlanner, Stories260KMatchesKvStorage) {
  KVLM_REQUIRE_SHARED(path, "stories260K.gguf");
  auto shape = load_model_shape(path.string());
  ASSERT_TRUE(shape.ok()) << shape.status().message();
  EXPECT_EQ(shape->num_layers, 5);
  EXPECT_EQ(shape->num_heads, 8);
  EXPECT_EQ(shape->num_kv_heads, 4);
  EXPECT_EQ(shape->head_dim, 8);
  for (KvType k : all_kv_types()) {
    for (KvType v : all_kv_types()) {
      auto f = kv_footprint(*shape, k, v, CacheForm::kFull, 16);
      ASSERT_TRUE(f.ok());
      auto storage = KvStorage::create({5, 4, 8, 16}, k, v, 4);
      ASSERT_TRUE(storage.ok()) << storage.status().message();
      EXPECT_EQ(f->bytes_per_block, (*storage)->bytes_per_block());
      EXPECT_EQ(static_cast<size_t>(std::ceil(f->bytes_per_token())), (*storage)->bytes_per_token());
    }
  }
  auto f32 = kv_footprint(*shape, KvType::kF32, KvType::kF32, CacheForm::kFull, 16);
  EXPECT_EQ(f32->bytes_per_token(), 2.0 * 5 * 4 * 8 * 4);  // 1,280 B
}

// The prediction a live run prints beside its pool: blocks the cache manager really takes.
TEST(KvPlanner, PredictionAgreesWithLiveCacheWithinOneBlockPerSequence) {
  const KvLayout layout{5, 4, 8, 16};
  const std::vector<int64_t> lengths = {37, 16, 1, 100, 0};
  for (KvType type : all_kv_types()) {
    auto storage = KvStorage::create(layout, type, type, 64);
    ASSERT_TRUE(storage.ok());
    KvCacheManager manager(64, layout.block_size);
    for (int64_t n : lengths) {
      const SeqId seq = manager.create_sequence();
      ASSERT_TRUE(manager.reserve(seq, static_cast<int>(n)));
      manager.append(seq, static_cast<int>(n));
    }
    const uint64_t live = static_cast<uint64_t>(manager.num_used_blocks()) * (*storage)->bytes_per_block();
    auto p = predict_pool_bytes(shape_from_kv_layout(layout), type, type, CacheForm::kFull, layout.block_size, lengths);
    ASSERT_TRUE(p.ok()) << p.status().message();
    EXPECT_EQ(p->block_bytes, live);
    EXPECT_EQ(p->formula_bytes, 154.0 * p->footprint.bytes_per_token());
    EXPECT_LE(p->formula_bytes, static_cast<double>(live));
    EXPECT_LE(static_cast<double>(live), p->formula_bytes + static_cast<double>(p->slack_bytes));
    EXPECT_EQ(p->slack_bytes, lengths.size() * (*storage)->bytes_per_block());
  }
}

// KIVI keeps the tail block and the residual window in f32: the planner's staging per
// sequence is what KvStorage says one sequence can hold; other codecs stage nothing.
TEST(KvPlanner, KiviStagingMatchesKvStorage) {
  const KvLayout layout{5, 4, 8, 16};
  const ModelShape shape = shape_from_kv_layout(layout);
  for (KvType k : all_kv_types()) {
    for (KvType v : all_kv_types()) {
      for (int residual : {0, 20, 32}) {
        auto f = kv_footprint(shape, k, v, CacheForm::kFull, layout.block_size);
        ASSERT_TRUE(f.ok());
        KvStorageOptions options;
        options.kivi_residual_tokens = residual;
        auto storage = KvStorage::create(layout, k, v, 4, options);
        ASSERT_TRUE(storage.ok()) << storage.status().message();
        const size_t expected = is_kivi(k) || is_kivi(v) ? (*storage)->residual_bytes_per_sequence() : 0;
        EXPECT_EQ(f->staging_bytes_per_sequence(residual), expected)
            << kv_type_name(k) << "/" << kv_type_name(v) << " residual " << residual;
        EXPECT_EQ(f->bytes_per_block, (*storage)->bytes_per_block());
      }
    }
  }
}

// 24 GiB for llama-3-8b in f16: 24 × 2^30 − 16.06e9 B of weights, whole 16-token blocks.
TEST(KvPlanner, MemoryFitArithmetic) {
  const ModelShape s = preset_or_die("llama-3-8b");
  PlanRequest r = request(8192);
  r.memory_bytes = uint64_t{24} << 30;
  r.weight_bytes = 16060000000;
  auto plan = make_plan(s, r);
  ASSERT_TRUE(plan.ok());
  const PlanRow& f16 = row_for(*plan, KvType::kF16);
  ASSERT_TRUE(f16.fit.has_value());
  const uint64_t available = (uint64_t{24} << 30) - 16060000000;  // 9,709,803,776
  EXPECT_EQ(f16.fit->available_bytes, available);
  const uint64_t block = 131072 * 16;
  EXPECT_EQ(f16.fit->tokens, static_cast<int64_t>(available / block * 16));  // 4629 blocks
  EXPECT_EQ(f16.fit->tokens, 74064);
  EXPECT_EQ(f16.fit->sequences, 9);  // 512 blocks per 8192-token sequence

  // Weights alone larger than memory: nothing fits, no underflow.
  FitQuery query;
  query.memory_bytes = 1000;
  query.weight_bytes = 5000;
  query.blocks.global = 512;  // 8192 tokens
  const MemoryFit none = compute_fit(s, f16.footprint, query);
  EXPECT_EQ(none.available_bytes, 0u);
  EXPECT_EQ(none.tokens, 0);
  EXPECT_EQ(none.sequences, 0);
  // A partly filled last block still takes a whole block.
  query.memory_bytes = 4 * block;
  query.weight_bytes = 0;
  query.blocks.global = 2;  // 17 tokens
  const MemoryFit partial = compute_fit(s, f16.footprint, query);
  EXPECT_EQ(partial.tokens, 64);
  EXPECT_EQ(partial.sequences, 2);
}

TEST(KvPlanner, RejectsBadRequests) {
  const ModelShape s = preset_or_die("llama-2-7b");
  EXPECT_FALSE(make_plan(s, request(0)).ok());
  EXPECT_FALSE(make_plan(s, request(100, 0)).ok());
  PlanRequest r = request(100);
  r.block_size = 0;
  EXPECT_FALSE(make_plan(s, r).ok());
  ModelShape bad = s;
  bad.num_kv_heads = 5;  // 32 is not a multiple of 5
  auto p = make_plan(bad, request(100));
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("kv heads 5"), std::string::npos) << p.status().message();
}

TEST(KvPlanner, EvictionBudgetCapsResidentTokens) {
  KvOption o;
  EXPECT_EQ(o.resident_tokens(5000), 5000);
  o.token_budget = 1024;
  EXPECT_TRUE(o.evicts());
  EXPECT_EQ(o.resident_tokens(5000), 1024);
  EXPECT_EQ(o.resident_tokens(100), 100);
}

}  // namespace
}  // namespace kvlm
