// query_rounding: the integer queries of integer-domain q·k, against the rule they state.
#include "attention/query_rounding.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace kvlm {
namespace {

using query_rounding::kQueryIntMax;
using query_rounding::round_query_row;

TEST(QueryRounding, EveryValueIsWithinHalfAStepAndTheLargestMapsToTheTop) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int n : {1, 8, 64, 129}) {
    std::vector<float> q(static_cast<size_t>(n));
    for (float& x : q) x = normal(rng);
    q[static_cast<size_t>(n / 2)] = -20.0f;  // the largest magnitude, negative
    const float scale = 0.125f;
    std::vector<int16_t> codes(q.size());
    const float step = round_query_row(q.data(), n, scale, codes.data());
    EXPECT_FLOAT_EQ(step, 20.0f * scale / kQueryIntMax);
    EXPECT_EQ(codes[static_cast<size_t>(n / 2)], -kQueryIntMax);
    for (size_t i = 0; i < q.size(); ++i) {
      EXPECT_LE(std::abs(codes[i]), kQueryIntMax);
      // Half a step, plus f32 rounding of the scaled value.
      EXPECT_LE(std::abs(static_cast<double>(codes[i]) * step - double{q[i] * scale}), 0.5 * step * (1 + 1e-5)) << i;
    }
  }
}

TEST(QueryRounding, ZeroRowsGiveZeroAndNonFiniteRowsPoisonTheStep) {
  std::vector<int16_t> codes(4, 7);
  const std::vector<float> zero(4, 0.0f);
  EXPECT_EQ(round_query_row(zero.data(), 4, 1.0f, codes.data()), 0.0f);
  for (int16_t c : codes) EXPECT_EQ(c, 0);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    const std::vector<float> q{1.0f, bad, -2.0f, 0.5f};
    EXPECT_TRUE(std::isnan(round_query_row(q.data(), 4, 1.0f, codes.data())));
  }
}

TEST(QueryRounding, OnlyInt8AndInt4KeysRoundQueries) {
  for (KvType t : {KvType::kF32, KvType::kF16, KvType::kBf16, KvType::kFp8, KvType::kKivi4, KvType::kKivi2}) {
    EXPECT_FALSE(query_rounding::rounds_queries(t)) << kv_type_name(t);
  }
  EXPECT_TRUE(query_rounding::rounds_queries(KvType::kInt8));
  EXPECT_TRUE(query_rounding::rounds_queries(KvType::kInt4));
}

}  // namespace
}  // namespace kvlm
