#include "engine/sampler.h"

#include <cmath>
#include <map>
#include <vector>

#include <gtest/gtest.h>

namespace kvlm {
namespace {

SamplerParams plain(float temperature) {
  SamplerParams p;
  p.temperature = temperature;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = 42;
  return p;
}

TEST(Sampler, GreedyPicksArgmaxAndLowestIdOnTies) {
  Sampler s(plain(0.0f));
  EXPECT_EQ(s.sample(std::vector<float>{0.1f, 3.0f, -1.0f, 2.9f}, {}), 1);
  EXPECT_EQ(s.sample(std::vector<float>{5.0f, 1.0f, 5.0f}, {}), 0);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegative) {
  SamplerParams p = plain(0.0f);
  p.repeat_penalty = 2.0f;
  Sampler s(p);
  // Token 0 (logit 3) is penalized to 1.5 < 2: token 1 wins.
  EXPECT_EQ(s.sample(std::vector<float>{3.0f, 2.0f}, std::vector<TokenId>{0}), 1);
  // Negative logits get more negative: token 0 (-1 -> -2) loses to token 1 (-1.5).
  EXPECT_EQ(s.sample(std::vector<float>{-1.0f, -1.5f}, std::vector<TokenId>{0, 0}), 1);
  // Only the last repeat_last_n tokens count.
  p.repeat_last_n = 1;
  Sampler s2(p);
  EXPECT_EQ(s2.sample(std::vector<float>{3.0f, 2.0f}, std::vector<TokenId>{0, 1}), 0);
}

// Draws many samples and returns the empirical frequency of each id.
std::map<TokenId, double> frequencies(Sampler& s, const std::vector<float>& logits, int draws) {
  std::map<TokenId, double> freq;
  for (int i = 0; i < draws; ++i) freq[s.sample(logits, {})] += 1.0 / draws;
  return freq;
}

TEST(Sampler, TemperatureOneMatchesSoftmax) {
  Sampler s(plain(1.0f));
  const std::vector<float> logits{0.0f, std::log(2.0f), std::log(5.0f)};  // p = 1/8, 2/8, 5/8
  auto f = frequencies(s, logits, 40000);
  EXPECT_NEAR(f[0], 0.125, 0.01);
  EXPECT_NEAR(f[1], 0.25, 0.01);
  EXPECT_NEAR(f[2], 0.625, 0.01);
}

TEST(Sampler, LowTemperatureSharpens) {
  Sampler s(plain(0.5f));
  const std::vector<float> logits{0.0f, std::log(2.0f)};  // at T=0.5: weights 1 and 4
  auto f = frequencies(s, logits, 40000);
  EXPECT_NEAR(f[1], 0.8, 0.01);
}

TEST(Sampler, TopKKeepsOnlyTheKBest) {
  SamplerParams p = plain(1.0f);
  p.top_k = 2;
  Sampler s(p);
  auto f = frequencies(s, {1.0f, 3.0f, 2.0f, 0.5f}, 5000);
  EXPECT_EQ(f.count(0), 0u);
  EXPECT_EQ(f.count(3), 0u);
  EXPECT_GT(f[1], f[2]);
}

TEST(Sampler, TopPCutsTheTail) {
  SamplerParams p = plain(1.0f);
  p.top_p = 0.7f;
  Sampler s(p);
  // p = 0.5, 0.3, 0.2: the first two reach 0.8 >= 0.7, the third is cut.
  auto f = frequencies(s, {std::log(0.5f), std::log(0.3f), std::log(0.2f)}, 20000);
  EXPECT_EQ(f.count(2), 0u);
  EXPECT_NEAR(f[0], 0.625, 0.015);
}

TEST(Sampler, MinPDropsUnlikelyTokens) {
  SamplerParams p = plain(1.0f);
  p.min_p = 0.5f;
  Sampler s(p);
  // p_max = 0.5; threshold 0.25 keeps 0.5 and 0.3, drops 0.2.
  auto f = frequencies(s, {std::log(0.5f), std::log(0.3f), std::log(0.2f)}, 20000);
  EXPECT_EQ(f.count(2), 0u);
}

TEST(Sampler, SameSeedSameSequence) {
  SamplerParams p = plain(1.0f);
  Sampler a(p), b(p);
  const std::vector<float> logits{0.1f, 0.2f, 0.3f, 0.4f, 0.5f};
  for (int i = 0; i < 100; ++i) ASSERT_EQ(a.sample(logits, {}), b.sample(logits, {}));
}

TEST(Sampler, ValidateRejectsNonsense) {
  SamplerParams p = plain(1.0f);
  p.top_p = 0.0f;
  EXPECT_FALSE(p.validate().ok());
  p = plain(1.0f);
  p.min_p = 2.0f;
  EXPECT_FALSE(p.validate().ok());
  p = plain(1.0f);
  p.repeat_penalty = -1.0f;
  EXPECT_FALSE(p.validate().ok());
  EXPECT_TRUE(plain(0.0f).validate().ok());
}

}  // namespace
}  // namespace kvlm
