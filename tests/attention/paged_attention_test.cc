#include "attention/paged_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "attention_test_util.h"

namespace kvlm {
namespace {

using testing::AttentionShape;
using testing::max_abs;
using testing::max_abs_diff;
using testing::PagedAttentionFixture;

// f32 kernels against the double reference on the same K/V: max |out - ref| must
// stay within kRelTol × max |ref| (f32 dot products, exp and sums over up to 1000
// tokens stay well inside this).
constexpr float kRelTol = 1e-5f;

// A rigorous bound for f16 storage against the UNROUNDED reference. With
// u = 2^-11 (f16 round to nearest) and subnormal error e = 2^-25:
//  - each score moves by at most delta = scale × max_rows sum_d |q_d| (u |k_d| + e);
//  - softmax weights then move by a factor within e^{±2 delta}, so sum |w' - w| <= e^{2 delta} - 1;
//  - out' - out = sum (w' - w) v' + sum w (v' - v), bounded by
//    (e^{2 delta} - 1) max|v| (1 + u) + u max|v| + e.
float f16_bound(const PagedAttentionFixture& f) {
  const float u = 1.0f / 2048.0f, e = 1.0f / 33554432.0f;
  const AttentionShape& s = f.shape;
  const int group = s.num_heads / s.num_kv_heads;
  double delta = 0.0;
  if (f.storage->k_type() == KvType::kF16) {
    for (int i = 0; i < s.num_queries; ++i) {
      for (int h = 0; h < s.num_heads; ++h) {
        const float* q = f.q.data() + (static_cast<size_t>(i) * s.num_heads + h) * s.head_dim;
        for (int t = 0; t < s.num_context_tokens; ++t) {
          const float* k = f.k.data() + (static_cast<size_t>(t) * s.num_kv_heads + h / group) * s.head_dim;
          double sum = 0.0;
          for (int d = 0; d < s.head_dim; ++d) sum += std::fabs(q[d]) * (u * std::fabs(k[d]) + e);
          delta = std::max(delta, sum * f.scale);
        }
      }
    }
  }
  const double vmax = max_abs(f.v);
  const double v_err = f.storage->v_type() == KvType::kF16 ? u * vmax + e : 0.0;
  return static_cast<float>(std::expm1(2.0 * delta) * vmax * (1.0 + u) + v_err);
}

void expect_matches_reference(const PagedAttentionFixture& f, const std::vector<float>& out) {
  const std::vector<float> ref = f.run_reference_stored();
  const float scale = std::max(max_abs(ref), 1e-3f);
  EXPECT_LE(max_abs_diff(out, ref), kRelTol * scale) << "against the reference on the stored K/V";
  if (f.storage->k_type() == KvType::kF16 || f.storage->v_type() == KvType::kF16) {
    const std::vector<float> ref_orig = f.run_reference_original();
    const float bound = f16_bound(f) + kRelTol * scale;
    const float err = max_abs_diff(out, ref_orig);
    EXPECT_LE(err, bound) << "against the reference on unrounded K/V";
    EXPECT_GT(err, 0.0f) << "f16 rounding should be visible";
  }
}

std::vector<AttentionShape> sweep_shapes() {
  std::vector<AttentionShape> shapes;
  const std::pair<int, int> heads[] = {{4, 4}, {8, 4}, {32, 8}, {8, 1}};
  for (auto [h, kvh] : heads) {
    for (int d : {8, 64, 128}) {
      for (int bs : {1, 16, 64}) {
        for (int ctx : {1, 17, 100, 1000}) {
          std::vector<int> queries = {1};
          if (ctx > 1) queries.push_back(std::min(5, ctx));
          if (ctx > 5 && ctx <= 100) queries.push_back(ctx);  // a whole prompt at once
          for (int nq : queries) {
            for (KvType t : {KvType::kF32, KvType::kF16}) {
              shapes.push_back({h, kvh, d, bs, ctx, nq, t, t});
            }
          }
        }
      }
    }
  }
  // K and V in different types.
  shapes.push_back({8, 4, 64, 16, 100, 5, KvType::kF32, KvType::kF16});
  shapes.push_back({8, 4, 64, 16, 1000, 1, KvType::kF16, KvType::kF32});
  shapes.push_back({32, 8, 128, 16, 300, 3, KvType::kF16, KvType::kF32});
  return shapes;
}

class PagedAttentionSweep : public ::testing::TestWithParam<AttentionShape> {};

TEST_P(PagedAttentionSweep, MatchesReference) {
  ThreadPool pool(2);
  const PagedAttentionFixture f = PagedAttentionFixture::make(GetParam(), 1234);
  expect_matches_reference(f, f.run_paged(pool));
}

INSTANTIATE_TEST_SUITE_P(Shapes, PagedAttentionSweep, ::testing::ValuesIn(sweep_shapes()),
                         [](const auto& info) { return info.param.name(); });

// Every kernel family over shapes that cover decode, prefill, splitting and MQA. A family the
// CPU lacks is a skip; a head_dim the family cannot take runs the portable kernels (its
// documented fallback). run_paged asserts the resolved family's kernels are the ones that ran.
class PagedAttentionIsa : public ::testing::TestWithParam<AttentionIsa> {};

TEST_P(PagedAttentionIsa, MatchesReference) {
  const AttentionIsa isa = GetParam();
  if (resolve_attention_isa(isa, 128) != isa) GTEST_SKIP() << attention_isa_name(isa) << " is not available on this CPU";
  ThreadPool pool(2);
  for (int d : {8, 16, 64, 128}) {
    if (resolve_attention_isa(isa, d) != isa) {
      std::printf("  %s does not take head_dim %d: checking the portable fallback\n", attention_isa_name(isa), d);
    }
    // Groups of 2, 8, 1, 3, 6 and 7 query heads: every register-blocking width.
    for (auto [h, kvh] : {std::pair{8, 4}, std::pair{8, 1}, std::pair{4, 4}, std::pair{6, 2}, std::pair{12, 2},
                          std::pair{7, 1}}) {
      for (auto [ctx, nq] : {std::pair{17, 1}, std::pair{1000, 1}, std::pair{100, 7}, std::pair{64, 64}}) {
        for (KvType t : {KvType::kF32, KvType::kF16}) {
          const AttentionShape s{h, kvh, d, 16, ctx, nq, t, t};
          SCOPED_TRACE(s.name());
          const PagedAttentionFixture f = PagedAttentionFixture::make(s, 99);
          expect_matches_reference(f, f.run_paged(pool, isa));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, PagedAttentionIsa,
                         ::testing::Values(AttentionIsa::kPortable, AttentionIsa::kAvx2, AttentionIsa::kAvx512),
                         [](const auto& info) { return std::string(attention_isa_name(info.param)); });

// The work split depends on shapes only, so 1 and 3 threads give identical bits.
TEST(PagedAttention, ThreadCountDoesNotChangeResults) {
  ThreadPool one(1), three(3);
  const AttentionShape shapes[] = {
      {32, 8, 64, 16, 1000, 1, KvType::kF16, KvType::kF16},  // decode, split into chunks
      {8, 1, 64, 16, 1000, 1, KvType::kF32, KvType::kF32},   // MQA decode, split
      {8, 4, 64, 16, 100, 100, KvType::kF32, KvType::kF32},  // prefill, many query tiles
      {8, 4, 128, 1, 600, 9, KvType::kF16, KvType::kF32},    // prefill, split
      {4, 4, 8, 64, 17, 1, KvType::kF32, KvType::kF32},
  };
  for (const AttentionShape& s : shapes) {
    SCOPED_TRACE(s.name());
    const PagedAttentionFixture f = PagedAttentionFixture::make(s, 5);
    for (AttentionIsa isa : {AttentionIsa::kAuto, AttentionIsa::kPortable}) {
      const std::vector<float> a = f.run_paged(one, isa);
      const std::vector<float> b = f.run_paged(three, isa);
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << attention_isa_name(isa);
      expect_matches_reference(f, a);
    }
  }
}

// Keys whose scores grow (or shrink) along the context make the running max
// change in most tiles and chunks, exercising the rescaling, with scores up to
// ~150: beyond exp's f32 range had the max not been subtracted. The values are
// small dyadic numbers so that every score is exact in f32 (the products are
// multiples of 2^-8 and their sums stay below 2^24 units), which keeps the 1e-5
// tolerance meaningful at such magnitudes.
TEST(PagedAttention, OnlineSoftmaxRescalesWithLargeScores) {
  ThreadPool pool(2);
  for (bool growing : {true, false}) {
    AttentionShape s{8, 2, 64, 16, 1000, 3, KvType::kF32, KvType::kF32};
    PagedAttentionFixture f = PagedAttentionFixture::make(s, 77, 1.0f);
    std::mt19937 rng(growing ? 1 : 2);
    std::uniform_int_distribution<int> small(1, 3);
    const size_t width = static_cast<size_t>(s.num_kv_heads) * s.head_dim;
    for (int t = 0; t < s.num_context_tokens; ++t) {
      const int ramp = growing ? t : s.num_context_tokens - t;
      for (size_t i = 0; i < width; ++i) f.k[static_cast<size_t>(t) * width + i] = ramp * small(rng) / 256.0f;
      const BlockId block(f.block_table[static_cast<size_t>(t / s.block_size)]);
      f.storage->write_token(PagedAttentionFixture::kLayer, block, t % s.block_size, f.k.data() + t * width,
                             f.v.data() + t * width);
    }
    for (float& x : f.q) x = static_cast<float>(small(rng) + 1);  // 2..4: positive scores growing with the ramp
    f.k_stored = f.k;
    f.v_stored = f.v;
    ASSERT_EQ(f.scale, 0.125f);
    const std::vector<float> out = f.run_paged(pool);
    const std::vector<float> ref = f.run_reference_stored();
    EXPECT_LE(max_abs_diff(out, ref), kRelTol * max_abs(ref)) << (growing ? "growing" : "shrinking");
  }
}

TEST(PagedAttention, ResolvesIsaForHeadDim) {
  EXPECT_EQ(resolve_attention_isa(AttentionIsa::kPortable, 64), AttentionIsa::kPortable);
  EXPECT_EQ(resolve_attention_isa(AttentionIsa::kAvx512, 8), AttentionIsa::kPortable);  // needs head_dim % 16
  EXPECT_EQ(resolve_attention_isa(AttentionIsa::kAvx2, 12), AttentionIsa::kPortable);   // needs head_dim % 8
  EXPECT_NE(resolve_attention_isa(AttentionIsa::kAuto, 64), AttentionIsa::kAuto);
  EXPECT_STREQ(attention_isa_name(AttentionIsa::kAvx2), "avx2");
}

TEST(PagedAttentionDeathTest, RejectsInconsistentArguments) {
  ThreadPool pool(1);
  const PagedAttentionFixture f = PagedAttentionFixture::make({8, 4, 8, 4, 10, 2, KvType::kF32, KvType::kF32}, 3);
  std::vector<float> out(f.q.size());
  PagedAttentionArgs args;
  args.storage = f.storage.get();
  args.layer = PagedAttentionFixture::kLayer;
  args.block_table = f.block_table.data();
  args.num_table_blocks = static_cast<int>(f.block_table.size());
  args.num_context_tokens = 10;
  args.num_queries = 2;
  args.num_heads = 8;
  args.q = f.q.data();
  args.out = out.data();
  args.scale = f.scale;
  auto with = [&](auto change) {
    PagedAttentionArgs a = args;
    change(a);
    return a;
  };
  EXPECT_DEATH(paged_attention(with([](auto& a) { a.num_heads = 6; }), pool), "not a multiple of num_kv_heads 4");
  EXPECT_DEATH(paged_attention(with([](auto& a) { a.num_context_tokens = 1; }), pool), "cannot include 2 queries");
  EXPECT_DEATH(paged_attention(with([](auto& a) { a.num_context_tokens = 13; }), pool), "need 4 blocks");
  EXPECT_DEATH(paged_attention(with([](auto& a) { a.layer = 2; }), pool), "layer 2 out of range");
  std::vector<int32_t> bad_table = f.block_table;
  bad_table[1] = 1000;
  EXPECT_DEATH(paged_attention(with([&](auto& a) { a.block_table = bad_table.data(); }), pool),
               "block_table\\[1\\] = 1000");
}

}  // namespace
}  // namespace kvlm
