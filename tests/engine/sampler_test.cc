#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
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

// Greedy over vocabulary-sized rows, checked against std::max_element (first maximum): lengths
// around the argmax's 256-value blocks and 16-value vector steps, the maximum (and ties of it)
// placed at every kind of position, and NaNs, which max_element skips unless one comes first.
TEST(Sampler, GreedyMatchesMaxElementOnLongRows) {
  Sampler s(plain(0.0f));
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> logit(-20.0f, 20.0f);
  auto expected = [](const std::vector<float>& v) {
    return static_cast<TokenId>(std::max_element(v.begin(), v.end()) - v.begin());
  };
  int checked = 0;
  for (size_t n : {1u, 3u, 15u, 16u, 17u, 255u, 256u, 257u, 511u, 1000u, 4099u, 128256u}) {
    for (int trial = 0; trial < 6; ++trial) {
      std::vector<float> v(n);
      for (float& x : v) x = logit(rng);
      const size_t top = rng() % n;
      if (trial == 1) v[top] = 25.0f;                                    // a clear maximum anywhere
      if (trial == 2) v[n - 1] = 25.0f;                                  // in the tail
      if (trial == 3) v[top] = v[n - 1] = v[n / 2] = 25.0f;              // ties: the first wins
      if (trial == 4) v[top] = std::nanf("");                            // a NaN is skipped...
      if (trial == 5) v[0] = std::nanf(""), v[n - 1] = 25.0f;            // ...unless it is first
      const std::vector<float> copy = v;
      EXPECT_EQ(s.sample(v, {}), expected(copy)) << "n " << n << " trial " << trial;
      ++checked;
    }
  }
  std::vector<float> flat(1000, -std::numeric_limits<float>::infinity());
  EXPECT_EQ(s.sample(flat, {}), 0);
  EXPECT_EQ(checked, 72);
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
