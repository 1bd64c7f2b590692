#include "attention/reference_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace kvlm {
namespace {

// Small cases worked out by hand: the oracle itself must be right.
TEST(ReferenceAttention, OneTokenReturnsItsValue) {
  const std::vector<float> q = {1, 2, 3, 4};
  const std::vector<float> k = {5, 6};
  const std::vector<float> v = {-1, 7};
  const std::vector<float> out = reference_attention(
      {.q = q.data(), .k = k.data(), .v = v.data(), .num_context_tokens = 1, .num_queries = 1, .num_heads = 2,
       .num_kv_heads = 1, .head_dim = 2, .scale = 0.5f});
  EXPECT_EQ(out, (std::vector<float>{-1, 7, -1, 7}));
}

TEST(ReferenceAttention, CausalSoftmaxByHand) {
  // One head, head_dim 1, 2 tokens, 2 queries (a whole prompt).
  const std::vector<float> q = {1, 2};
  const std::vector<float> k = {0, 1};
  const std::vector<float> v = {10, 20};
  const std::vector<float> out = reference_attention(
      {.q = q.data(), .k = k.data(), .v = v.data(), .num_context_tokens = 2, .num_queries = 2, .num_heads = 1,
       .num_kv_heads = 1, .head_dim = 1, .scale = 1.0f});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_FLOAT_EQ(out[0], 10.0f);  // query 0 sees token 0 only
  // query 1: scores 0 and 2 → weights 1/(1+e^2), e^2/(1+e^2).
  const double w1 = std::exp(2.0) / (1.0 + std::exp(2.0));
  EXPECT_FLOAT_EQ(out[1], static_cast<float>(10.0 * (1.0 - w1) + 20.0 * w1));
}

TEST(ReferenceAttention, GroupedHeadsReadTheirKvHead) {
  // 4 query heads, 2 kv heads: heads 0,1 → kv 0 (value 1), heads 2,3 → kv 1 (value 2).
  const std::vector<float> q(4, 1.0f);
  const std::vector<float> k(2, 0.0f);
  const std::vector<float> v = {1, 2};
  const std::vector<float> out = reference_attention(
      {.q = q.data(), .k = k.data(), .v = v.data(), .num_context_tokens = 1, .num_queries = 1, .num_heads = 4,
       .num_kv_heads = 2, .head_dim = 1, .scale = 1.0f});
  EXPECT_EQ(out, (std::vector<float>{1, 1, 2, 2}));
}

}  // namespace
}  // namespace kvlm
