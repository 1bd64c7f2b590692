// Attention sinks and a sliding window (token eviction): the reference by hand, and the paged kernels against it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "attention/paged_attention.h"
#include "attention/reference_attention.h"
#include "attention_test_util.h"

namespace kvlm {
namespace {

using testing::AttentionShape;
using testing::max_abs;
using testing::max_abs_diff;
using testing::PagedAttentionFixture;

// As in quantized_attention_test.cc: against the double reference over the decoded
// (stored) K/V only f32 rounding differs, so 1e-5 relative to the output's magnitude.
constexpr float kRelTol = 1e-5f;

// ---- The reference itself, by hand ----

// One head, head_dim 1, 5 tokens, one query (token 4). Sink: token 0; window: [3, 4];
// tokens 1 and 2 are evicted (NaN: they must not be read).
struct HandCase {
  std::vector<float> q = {1.0f};
  std::vector<float> q_sink = {3.0f};
  std::vector<float> k = {1.0f, NAN, NAN, 0.0f, 2.0f};
  std::vector<float> v = {10.0f, NAN, NAN, 20.0f, 40.0f};
  ReferenceAttentionArgs args(const float* qs) const {
    return {.q = q.data(), .k = k.data(), .v = v.data(), .num_context_tokens = 5, .num_queries = 1, .num_heads = 1,
            .num_kv_heads = 1, .head_dim = 1, .scale = 1.0f, .num_sink_tokens = 1, .window_begin = 3, .q_sink = qs};
  }
};

TEST(ReferenceAttentionWindow, SinkAndWindowByHand) {
  const HandCase c;
  // Scores: sink 1*1 = 1, token 3: 0, token 4: 2.
  std::vector<double> w;
  ReferenceAttentionArgs a = c.args(nullptr);
  a.weights = &w;
  const std::vector<float> out = reference_attention(a);
  const double e0 = std::exp(1.0), e3 = 1.0, e4 = std::exp(2.0), sum = e0 + e3 + e4;
  ASSERT_EQ(out.size(), 1u);
  EXPECT_NEAR(out[0], (10.0 * e0 + 20.0 * e3 + 40.0 * e4) / sum, 1e-5);
  ASSERT_EQ(w.size(), 5u);
  EXPECT_NEAR(w[0], e0 / sum, 1e-12);
  EXPECT_EQ(w[1], 0.0);
  EXPECT_EQ(w[2], 0.0);
  EXPECT_NEAR(w[3], e3 / sum, 1e-12);
  EXPECT_NEAR(w[4], e4 / sum, 1e-12);
}

TEST(ReferenceAttentionWindow, SinkScoredWithQSink) {
  const HandCase c;
  // The sink's score is now 3*1 = 3; the window keeps q: 0 and 2.
  const std::vector<float> out = reference_attention(c.args(c.q_sink.data()));
  const double e0 = std::exp(3.0), e3 = 1.0, e4 = std::exp(2.0), sum = e0 + e3 + e4;
  EXPECT_NEAR(out[0], (10.0 * e0 + 20.0 * e3 + 40.0 * e4) / sum, 1e-5);
}

TEST(ReferenceAttentionWindow, PrefillQueriesShareTheWindowCausally) {
  // 4 tokens, 2 queries (tokens 2, 3), no sinks, window from 1: query 0 sees [1, 2],
  // query 1 sees [1, 3]; token 0 is evicted.
  const std::vector<float> q = {1.0f, 1.0f};
  const std::vector<float> k = {NAN, 1.0f, 0.0f, 1.0f};
  const std::vector<float> v = {NAN, 2.0f, 4.0f, 8.0f};
  std::vector<double> w;
  const std::vector<float> out = reference_attention(
      {.q = q.data(), .k = k.data(), .v = v.data(), .num_context_tokens = 4, .num_queries = 2, .num_heads = 1,
       .num_kv_heads = 1, .head_dim = 1, .scale = 1.0f, .num_sink_tokens = 0, .window_begin = 1, .weights = &w});
  const double e = std::exp(1.0);
  EXPECT_NEAR(out[0], (2.0 * e + 4.0) / (e + 1.0), 1e-5);
  EXPECT_NEAR(out[1], (2.0 * e + 4.0 + 8.0 * e) / (2.0 * e + 1.0), 1e-5);
  ASSERT_EQ(w.size(), 8u);
  EXPECT_EQ(w[0], 0.0);
  EXPECT_EQ(w[3], 0.0);  // query 0 does not see token 3 (causal)
  EXPECT_EQ(w[4], 0.0);
  EXPECT_NEAR(w[1] + w[2], 1.0, 1e-12);
  EXPECT_NEAR(w[5] + w[6] + w[7], 1.0, 1e-12);
}

// ---- The paged kernels against the reference ----

using WindowCase = testing::EvictionCase;
using testing::make_eviction_fixture;


void expect_all_isas_match(const PagedAttentionFixture& f, ThreadPool& pool) {
  const std::vector<float> ref = f.run_reference_stored();
  const float scale = std::max(max_abs(ref), 1e-3f);
  for (AttentionIsa isa : {AttentionIsa::kPortable, AttentionIsa::kAvx2, AttentionIsa::kAvx512}) {
    const std::vector<float> out = f.run_paged(pool, isa);
    EXPECT_LE(max_abs_diff(out, ref), kRelTol * scale)
        << attention_isa_name(resolve_attention_isa(isa, f.shape.head_dim));
  }
}

std::vector<WindowCase> window_cases() {
  std::vector<WindowCase> cases;
  // 100 context tokens; the prefill's first query sits at 95. Evictions: a window starting
  // mid-block (37) with and without sinks, a block-aligned one (48) with whole blocks
  // evicted between the sinks and the window, and one starting at the first query (95).
  const WindowCase evictions[] = {{{}, 0, 37, false}, {{}, 4, 37, true}, {{}, 4, 48, false},
                                  {{}, 4, 48, true},  {{}, 4, 95, true}};
  int rotation = 0;
  for (KvType t : {KvType::kF32, KvType::kF16, KvType::kInt8, KvType::kInt4, KvType::kKivi4}) {
    for (auto [h, kvh] : {std::pair{4, 4}, std::pair{8, 2}}) {  // MHA, GQA
      for (auto [d, bs] : {std::pair{64, 16}, std::pair{64, 1}, std::pair{8, 16}}) {
        for (int nq : {1, 5}) {  // decode, prefill
          // Every eviction for the common shape; two of them, in turn, for the others.
          const bool all = d == 64 && bs == 16;
          for (int e = 0; e < (all ? 5 : 2); ++e) {
            WindowCase c = evictions[all ? e : (rotation++) % 5];
            c.shape = {h, kvh, d, bs, 100, nq, t, t};
            cases.push_back(c);
          }
        }
      }
    }
  }
  for (KvType t : {KvType::kBf16, KvType::kFp8, KvType::kKivi2}) {
    cases.push_back({{8, 2, 64, 16, 100, 1, t, t}, 4, 37, true});
    cases.push_back({{8, 2, 64, 16, 100, 5, t, t}, 4, 48, false});
  }
  // K and V in different codecs.
  cases.push_back({{8, 2, 64, 16, 100, 3, KvType::kInt8, KvType::kInt4}, 4, 37, true});
  cases.push_back({{8, 2, 64, 16, 100, 3, KvType::kKivi4, KvType::kF16}, 4, 48, true});
  // KIVI with a residual window: staged and sealed blocks, the window starting inside both.
  cases.push_back({{8, 2, 64, 16, 100, 1, KvType::kKivi4, KvType::kKivi4, 32}, 4, 40, true});
  cases.push_back({{8, 2, 64, 16, 100, 4, KvType::kKivi4, KvType::kKivi4, 32}, 4, 75, true});
  // Long decode split into chunks (flash-decoding): the window starts inside a chunk, and
  // a window shorter than a chunk.
  cases.push_back({{32, 8, 64, 16, 700, 1, KvType::kF32, KvType::kF32}, 4, 333, true});
  cases.push_back({{32, 8, 64, 16, 700, 1, KvType::kKivi4, KvType::kKivi4}, 4, 333, true});
  cases.push_back({{32, 8, 64, 16, 700, 1, KvType::kInt8, KvType::kInt8}, 4, 600, false});
  cases.push_back({{8, 8, 64, 16, 1100, 1, KvType::kF32, KvType::kF32}, 0, 200, false});
  return cases;
}

class WindowAttention : public ::testing::TestWithParam<WindowCase> {};

TEST_P(WindowAttention, MatchesReferenceOnDecodedBlocksForEveryIsa) {
  ThreadPool pool(2);
  const PagedAttentionFixture f = make_eviction_fixture(GetParam(), 2468);
  expect_all_isas_match(f, pool);
}

INSTANTIATE_TEST_SUITE_P(Cases, WindowAttention, ::testing::ValuesIn(window_cases()),
                         [](const auto& info) { return info.param.name(); });

// window_begin <= num_sink_tokens hides nothing: the same as plain causal attention
// (without q_sink, which would change the sinks' scores).
TEST(WindowAttentionEdges, WindowAtOrBeforeSinksIsPlainAttention) {
  ThreadPool pool(2);
  for (KvType t : {KvType::kF32, KvType::kInt8, KvType::kKivi4}) {
    for (int nq : {1, 5}) {
      PagedAttentionFixture f = PagedAttentionFixture::make({8, 2, 64, 16, 100, nq, t, t}, 99);
      const std::vector<float> plain = f.run_reference_stored();
      const float scale = std::max(max_abs(plain), 1e-3f);
      for (auto [sinks, wb] : {std::pair{4, 4}, std::pair{4, 2}, std::pair{20, 17}, std::pair{0, 0}}) {
        f.num_sink_tokens = sinks;
        f.window_begin = wb;
        SCOPED_TRACE(fmt::format("{} sinks {} window {}", f.shape.name(), sinks, wb));
        EXPECT_EQ(max_abs_diff(f.run_reference_stored(), plain), 0.0f);  // the oracle agrees with itself
        for (AttentionIsa isa : {AttentionIsa::kPortable, AttentionIsa::kAvx2, AttentionIsa::kAvx512}) {
          EXPECT_LE(max_abs_diff(f.run_paged(pool, isa), plain), kRelTol * scale) << attention_isa_name(isa);
        }
      }
    }
  }
}

// q_sink equal to q is the same as no q_sink.
TEST(WindowAttentionEdges, QSinkEqualToQChangesNothing) {
  ThreadPool pool(2);
  PagedAttentionFixture f = PagedAttentionFixture::make({8, 2, 64, 16, 100, 3, KvType::kInt8, KvType::kInt8}, 5);
  f.num_sink_tokens = 4;
  f.window_begin = 40;
  const std::vector<float> without = f.run_paged(pool);
  f.q_sink = f.q;
  const std::vector<float> with = f.run_paged(pool);
  EXPECT_LE(max_abs_diff(with, without), kRelTol * std::max(max_abs(without), 1e-3f));
}

// The evicted slots hold NaN: a kernel that reads them (or multiplies a zero weight by
// their values) poisons its output.
TEST(WindowAttentionEdges, EvictedSlotsAreNeverRead) {
  ThreadPool pool(2);
  for (KvType t : {KvType::kF32, KvType::kInt8, KvType::kKivi4}) {
    for (auto [nq, wb] : {std::pair{1, 37}, std::pair{5, 48}, std::pair{1, 95}}) {
      WindowCase c{{8, 2, 64, 16, 100, nq, t, t}, 4, wb, true};
      PagedAttentionFixture f = make_eviction_fixture(c, 77);
      f.poison_evicted();
      SCOPED_TRACE(c.name());
      expect_all_isas_match(f, pool);
    }
  }
}

}  // namespace
}  // namespace kvlm
