// accumulate_attention_weights: the per-token sums of softmax weights, against the reference's weights.
#include "attention/attention_weights.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "attention_test_util.h"

namespace kvlm {
namespace {

using testing::AttentionShape;
using testing::PagedAttentionFixture;

// Scores and exponentials are f32 (the reference's are double): a score off by a relative
// 1e-7 moves its weight by about |score| × 1e-7 relative, and |score| stays below ~30 here.
// Tolerance per token: 1e-5 of the token's reference sum, plus 1e-7 of a whole row's
// weight (1) so that weights near zero do not demand an impossible relative accuracy.
constexpr double kRelTol = 1e-5;
constexpr double kAbsTol = 1e-7;

using WeightsCase = testing::EvictionCase;
using testing::make_eviction_fixture;


// The reference's weights summed over queries and heads: [num_context_tokens].
std::vector<double> reference_token_sums(const PagedAttentionFixture& f) {
  std::vector<double> w;  // [num_queries, num_heads, num_context_tokens]
  f.run_reference_stored(&w);
  const size_t T = static_cast<size_t>(f.shape.num_context_tokens);
  std::vector<double> sums(T, 0.0);
  for (size_t row = 0; row < w.size() / T; ++row) {
    for (size_t t = 0; t < T; ++t) sums[t] += w[row * T + t];
  }
  return sums;
}

std::vector<float> run_weights(const PagedAttentionFixture& f, ThreadPool& pool) {
  std::vector<float> sums(static_cast<size_t>(f.shape.num_context_tokens), 0.0f);
  accumulate_attention_weights(f.paged_args(nullptr), sums, pool);
  return sums;
}

void expect_matches_reference(const PagedAttentionFixture& f, const std::vector<float>& got) {
  const std::vector<double> want = reference_token_sums(f);
  ASSERT_EQ(got.size(), want.size());
  for (size_t t = 0; t < want.size(); ++t) {
    ASSERT_NEAR(got[t], want[t], kRelTol * want[t] + kAbsTol) << "token " << t;
    const bool evicted = static_cast<int>(t) >= f.num_sink_tokens && static_cast<int>(t) < f.window_begin;
    if (evicted) {
      ASSERT_EQ(got[t], 0.0f) << "evicted token " << t;
    }
  }
  // Every (query, head) row sums to 1.
  const double total = std::accumulate(got.begin(), got.end(), 0.0);
  EXPECT_NEAR(total, static_cast<double>(f.shape.num_queries) * f.shape.num_heads, 1e-4);
}

std::vector<WeightsCase> weights_cases() {
  std::vector<WeightsCase> cases;
  const WeightsCase evictions[] = {{{}, 0, 0, false}, {{}, 0, 37, false}, {{}, 4, 37, true}, {{}, 4, 48, false}};
  for (KvType t : {KvType::kF32, KvType::kF16, KvType::kInt8, KvType::kInt4, KvType::kKivi4}) {
    for (auto [h, kvh] : {std::pair{4, 4}, std::pair{8, 2}, std::pair{8, 1}}) {  // MHA, GQA, MQA
      for (auto [d, bs] : {std::pair{64, 16}, std::pair{8, 1}}) {
        for (int nq : {1, 7}) {  // decode; a SnapKV-like observation window
          for (WeightsCase c : evictions) {
            c.shape = {h, kvh, d, bs, 100, nq, t, t};
            cases.push_back(c);
          }
        }
      }
    }
  }
  // KIVI with staged and sealed blocks; mixed codecs (only K matters).
  cases.push_back({{8, 2, 64, 16, 100, 4, KvType::kKivi4, KvType::kKivi4, 32}, 4, 40, true});
  cases.push_back({{8, 2, 64, 16, 100, 1, KvType::kKivi2, KvType::kF16}, 4, 48, true});
  cases.push_back({{8, 2, 64, 16, 100, 3, KvType::kFp8, KvType::kInt4}, 0, 50, false});
  cases.push_back({{32, 8, 64, 16, 700, 1, KvType::kInt8, KvType::kInt8}, 4, 333, true});
  return cases;
}

class AttentionWeights : public ::testing::TestWithParam<WeightsCase> {};

TEST_P(AttentionWeights, MatchReferenceSums) {
  ThreadPool pool(2);
  const PagedAttentionFixture f = make_eviction_fixture(GetParam(), 1357);
  expect_matches_reference(f, run_weights(f, pool));
}

// The weights the kernels emit while they attend (PagedAttentionArgs::token_weights) are the
// same sums, on every ISA path, and the attention output is unchanged by asking for them.
TEST_P(AttentionWeights, KernelEmittedWeightsMatchReferenceSums) {
  ThreadPool pool(2);
  const PagedAttentionFixture f = make_eviction_fixture(GetParam(), 1357);
  for (AttentionIsa isa : {AttentionIsa::kAuto, AttentionIsa::kPortable}) {
    std::vector<float> out(f.q.size()), plain(f.q.size());
    paged_attention(f.paged_args(plain.data()), pool, isa);
    std::vector<float> sums(static_cast<size_t>(f.shape.num_context_tokens), 0.0f);
    PagedAttentionArgs args = f.paged_args(out.data());
    args.token_weights = sums.data();
    paged_attention(args, pool, isa);
    SCOPED_TRACE(attention_isa_name(isa));
    expect_matches_reference(f, sums);
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], plain[i], 1e-6f * (1.0f + std::fabs(plain[i]))) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, AttentionWeights, ::testing::ValuesIn(weights_cases()),
                         [](const auto& info) { return info.param.name(); });

// Query i alone (a context ending at its own position) gives num_heads in total, and the
// per-query calls add up to the call over all queries.
TEST(AttentionWeightsEdges, PerQuerySumsAreNumHeads) {
  ThreadPool pool(2);
  const PagedAttentionFixture f = make_eviction_fixture({{8, 2, 64, 16, 90, 6, KvType::kInt8, KvType::kInt8}, 4, 30, true}, 3);
  const std::vector<float> all = run_weights(f, pool);
  std::vector<float> by_query(all.size(), 0.0f);
  const size_t row = static_cast<size_t>(f.shape.num_heads) * f.shape.head_dim;
  for (int i = 0; i < f.shape.num_queries; ++i) {
    PagedAttentionArgs args = f.paged_args(nullptr);
    args.num_context_tokens = f.shape.num_context_tokens - f.shape.num_queries + i + 1;
    args.num_queries = 1;
    args.q = f.q.data() + i * row;
    args.q_sink = f.q_sink.data() + i * row;
    std::vector<float> one(all.size(), 0.0f);
    accumulate_attention_weights(args, one, pool);
    EXPECT_NEAR(std::accumulate(one.begin(), one.end(), 0.0), f.shape.num_heads, 1e-5) << "query " << i;
    for (size_t t = 0; t < all.size(); ++t) by_query[t] += one[t];
  }
  for (size_t t = 0; t < all.size(); ++t) EXPECT_NEAR(by_query[t], all[t], 1e-5 * all[t] + 1e-6) << t;
}

// The weights are added to what token_weights holds (a running H2O score), and only the
// first num_context_tokens entries are touched.
TEST(AttentionWeightsEdges, AddsToExistingSums) {
  ThreadPool pool(2);
  const PagedAttentionFixture f = make_eviction_fixture({{8, 2, 64, 16, 50, 1, KvType::kF32, KvType::kF32}, 2, 20, false}, 8);
  const std::vector<float> fresh = run_weights(f, pool);
  std::vector<float> running(60, 1.5f);
  accumulate_attention_weights(f.paged_args(nullptr), running, pool);
  for (size_t t = 0; t < 50; ++t) EXPECT_EQ(running[t], 1.5f + fresh[t]) << t;
  for (size_t t = 50; t < 60; ++t) EXPECT_EQ(running[t], 1.5f) << t;
}

// The split depends on the shapes only: any thread count gives the same bits.
TEST(AttentionWeightsEdges, SameBitsForAnyThreadCount) {
  const PagedAttentionFixture f = make_eviction_fixture({{8, 1, 64, 16, 300, 9, KvType::kInt4, KvType::kInt4}, 4, 100, true}, 4);
  ThreadPool one(1), three(3);
  EXPECT_EQ(run_weights(f, one), run_weights(f, three));
}

// The evicted slots hold NaN: they must never be read.
TEST(AttentionWeightsEdges, EvictedSlotsAreNeverRead) {
  ThreadPool pool(2);
  for (KvType t : {KvType::kF32, KvType::kInt8, KvType::kKivi4}) {
    for (int nq : {1, 5}) {
      PagedAttentionFixture f = make_eviction_fixture({{8, 2, 64, 16, 100, nq, t, t}, 4, 37, true}, 21);
      f.poison_evicted();
      SCOPED_TRACE(f.shape.name());
      expect_matches_reference(f, run_weights(f, pool));
    }
  }
}

// A peaked softmax: the scores' scale does not overflow the exponentials.
TEST(AttentionWeightsEdges, LargeScoresStayFinite) {
  ThreadPool pool(2);
  PagedAttentionFixture f = PagedAttentionFixture::make({4, 4, 64, 16, 64, 2, KvType::kF32, KvType::kF32}, 6, 400.0f);
  f.num_sink_tokens = 1;
  f.window_begin = 10;
  const std::vector<float> got = run_weights(f, pool);
  for (float w : got) ASSERT_TRUE(std::isfinite(w));
  EXPECT_NEAR(std::accumulate(got.begin(), got.end(), 0.0), 8.0, 1e-4);
}

}  // namespace
}  // namespace kvlm

namespace kvlm {
namespace {

// SnapKV asks for the last queries only: first_weight_query skips the others, and the sums
// equal the side pass run over those queries alone.
TEST(AttentionWeightsEdges, KernelWeightsOfTheLastQueriesOnly) {
  ThreadPool pool(2);
  const PagedAttentionFixture f = make_eviction_fixture({{8, 2, 64, 16, 120, 9, KvType::kInt8, KvType::kInt8}, 4, 40, true}, 5);
  std::vector<float> out(f.q.size()), got(120, 0.0f), want(120, 0.0f);
  PagedAttentionArgs args = f.paged_args(out.data());
  args.token_weights = got.data();
  args.first_weight_query = 6;
  paged_attention(args, pool);
  PagedAttentionArgs last = f.paged_args(nullptr);
  const size_t row = static_cast<size_t>(f.shape.num_heads) * f.shape.head_dim;
  last.num_queries = 3;
  last.q = f.q.data() + 6 * row;
  last.q_sink = f.q_sink.data() + 6 * row;
  accumulate_attention_weights(last, want, pool);
  for (size_t t = 0; t < got.size(); ++t) EXPECT_NEAR(got[t], want[t], 1e-5 * want[t] + 1e-6) << t;
  EXPECT_NEAR(std::accumulate(got.begin(), got.end(), 0.0), 3.0 * f.shape.num_heads, 1e-4);
}

}  // namespace
}  // namespace kvlm

namespace kvlm {
namespace {

// A long H2O step is run as slices of queries when its scores would pass the limit: the output
// and the weights equal the unsliced call (weights to f32 summation order).
TEST(AttentionWeightsEdges, SlicedQueriesGiveTheSameOutputAndWeights) {
  ThreadPool pool(2);
  for (int first_weight_query : {0, 5}) {
    const PagedAttentionFixture f =
        make_eviction_fixture({{8, 2, 64, 16, 150, 40, KvType::kInt8, KvType::kF16}, 4, 40, true}, 7);
    std::vector<float> out_whole(f.q.size()), out_sliced(f.q.size()), w_whole(150, 0.0f), w_sliced(150, 0.0f);
    PagedAttentionArgs whole = f.paged_args(out_whole.data());
    whole.token_weights = w_whole.data();
    whole.first_weight_query = first_weight_query;
    paged_attention(whole, pool);
    PagedAttentionArgs sliced = f.paged_args(out_sliced.data());
    sliced.token_weights = w_sliced.data();
    sliced.first_weight_query = first_weight_query;
    // 8 heads x 150 tokens = 1200 floats a query: a limit of 6000 gives slices of 5 queries.
    attention_internal::paged_attention_with_score_limit(sliced, pool, AttentionIsa::kAuto, 6000);
    EXPECT_LE(testing::max_abs_diff(out_whole, out_sliced), 1e-5f * testing::max_abs(out_whole)) << first_weight_query;
    for (size_t t = 0; t < w_whole.size(); ++t) {
      EXPECT_NEAR(w_sliced[t], w_whole[t], 1e-5 * w_whole[t] + 1e-6) << "token " << t << ", first " << first_weight_query;
    }
  }
}

}  // namespace
}  // namespace kvlm
