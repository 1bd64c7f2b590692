#include "engine/sampler.h"

#include "core/rng.h"

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
  // Ties at the k-th logit go to the lower ids.
  auto tied = frequencies(s, {5.0f, 1.0f, 5.0f, 5.0f, 5.0f}, 4000);
  EXPECT_EQ(tied.size(), 2u);
  EXPECT_NEAR(tied[0], 0.5, 0.05);
  EXPECT_NEAR(tied[2], 0.5, 0.05);
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

// The sampler's definition written out plainly: sort the whole vocabulary (logit descending,
// ties to the lower id), cut with top-k, then top-p on probabilities normalised over what top-k
// kept, then min-p against the best; draw with temperature over the survivors from the most
// likely, one Rng double per draw. The sampler sorts only what a cut can keep; with these
// cuts it must pick the same token as this, draw for draw.
struct Survivor {
  TokenId id;
  double weight;  // at the sampling temperature, relative to the best
};
std::vector<Survivor> reference_survivors(const SamplerParams& p, const std::vector<float>& logits) {
  std::vector<std::pair<float, TokenId>> order;
  for (size_t i = 0; i < logits.size(); ++i) order.push_back({logits[i], static_cast<TokenId>(i)});
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < order.size()) order.resize(static_cast<size_t>(p.top_k));
  const double best = order.front().first;
  double sum = 0;
  for (const auto& [l, id] : order) sum += std::exp(l - best);
  size_t keep = order.size();
  if (p.top_p < 1.0f) {
    double cumulative = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      cumulative += std::exp(order[i].first - best) / sum;
      if (cumulative >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.0f) {
    size_t cut = 1;
    while (cut < keep && std::exp(order[cut].first - best) >= p.min_p) ++cut;
    keep = cut;
  }
  std::vector<Survivor> survivors;
  for (size_t i = 0; i < keep; ++i) survivors.push_back({order[i].second, std::exp((order[i].first - best) / p.temperature)});
  return survivors;
}

TokenId reference_draw(const std::vector<Survivor>& survivors, Rng& rng) {
  double total = 0;
  for (const Survivor& s : survivors) total += s.weight;
  double r = rng.next_double() * total;
  for (const Survivor& s : survivors) {
    r -= s.weight;
    if (r < 0) return s.id;
  }
  return survivors.back().id;
}

TEST(Sampler, CutsMatchTheFullSortDrawForDraw) {
  struct Cuts {
    int top_k;
    float top_p, min_p, temperature;
  };
  const std::vector<Cuts> cuts = {
      {40, 0.95f, 0.05f, 0.8f},  // the CLI's defaults
      {40, 1.0f, 0.0f, 1.0f},    {1, 1.0f, 0.0f, 1.0f},     {0, 0.9f, 0.0f, 1.0f},  {0, 0.999999f, 0.0f, 1.3f},
      {0, 1.0f, 0.05f, 0.7f},    {0, 1.0f, 1e-6f, 1.0f},    {0, 0.5f, 0.2f, 2.0f},  {7, 0.3f, 0.0f, 1.0f},
  };
  std::mt19937 gen(11);
  int draws = 0;
  for (size_t vocab : {3u, 50u, 1000u, 32000u}) {
    for (float spread : {0.5f, 3.0f, 12.0f, -2.0f}) {  // nearly flat to peaked; negative: whole numbers
      std::normal_distribution<float> logit(0.0f, std::abs(spread));
      std::vector<float> logits(vocab);
      for (float& l : logits) l = spread < 0 ? std::round(logit(gen)) : logit(gen);  // ties at every cut
      if (vocab > 10) logits[vocab / 3] = logits[vocab / 2];  // a tie
      for (const Cuts& c : cuts) {
        SamplerParams p = plain(c.temperature);
        p.top_k = c.top_k;
        p.top_p = c.top_p;
        p.min_p = c.min_p;
        p.seed = 5;
        const bool cuts_something = (c.top_k > 0 && static_cast<size_t>(c.top_k) < vocab) || c.top_p < 1.0f ||
                                    c.min_p > 0.0f;
        if (!cuts_something) continue;  // drawn in id order: NoCutDrawsFromTheWholeVocabulary
        Sampler sampler(p);
        Rng rng(5);
        const std::vector<Survivor> survivors = reference_survivors(p, logits);
        for (int i = 0; i < 40; ++i, ++draws) {
          ASSERT_EQ(sampler.sample(logits, {}), reference_draw(survivors, rng))
              << "vocab " << vocab << " spread " << spread << " top_k " << c.top_k << " top_p " << c.top_p
              << " min_p " << c.min_p << " draw " << i;
        }
      }
    }
  }
  EXPECT_EQ(draws, (4 * 9 - 1) * 4 * 40);  // {40, 1, 0} cuts nothing from 3 tokens
}

// No cut: the whole vocabulary is drawn from (in id order, without sorting). A large vocabulary
// whose mass sits on a few tokens spread through it: frequencies follow the softmax.
TEST(Sampler, NoCutDrawsFromTheWholeVocabulary) {
  SamplerParams p = plain(1.0f);
  Sampler s(p);
  std::vector<float> logits(32768, -30.0f);
  logits[5] = std::log(1.0f);
  logits[20000] = std::log(2.0f);
  logits[32767] = std::log(5.0f);
  auto f = frequencies(s, logits, 10000);
  EXPECT_NEAR(f[5], 0.125, 0.012);
  EXPECT_NEAR(f[20000], 0.25, 0.015);
  EXPECT_NEAR(f[32767], 0.625, 0.016);
  const double others = 1.0 - f[5] - f[20000] - f[32767];
  EXPECT_LT(others, 0.002);  // 32k tokens of weight e^-30 each: ~1e-9 of the mass
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
