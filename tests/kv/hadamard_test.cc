// hadamard_rotate_heads against the explicit Walsh–Hadamard matrix, and the properties attention relies on.
#include "kv/hadamard.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

namespace kvlm {
namespace {

// Sylvester's construction: H[i][j] = (-1)^popcount(i & j), divided by sqrt(b).
double hadamard_entry(int i, int j, int b) {
  return (std::popcount(static_cast<unsigned>(i & j)) % 2 == 0 ? 1.0 : -1.0) / std::sqrt(static_cast<double>(b));
}

std::vector<float> random_heads(int num_heads, int head_dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(num_heads) * head_dim);
  for (float& v : x) v = normal(rng);
  return x;
}

TEST(Hadamard, BlockIsTheLargestPowerOfTwoDividingHeadDim) {
  EXPECT_EQ(hadamard_block(8), 8);
  EXPECT_EQ(hadamard_block(64), 64);
  EXPECT_EQ(hadamard_block(128), 128);
  EXPECT_EQ(hadamard_block(96), 32);
  EXPECT_EQ(hadamard_block(80), 16);
  EXPECT_EQ(hadamard_block(7), 1);
}

TEST(Hadamard, EqualsTheExplicitBlockDiagonalMatrix) {
  for (int d : {1, 2, 8, 48, 64, 96}) {
    const int heads = 3;
    const std::vector<float> x = random_heads(heads, d, static_cast<uint32_t>(d));
    std::vector<float> y = x;
    hadamard_rotate_heads(y.data(), heads, d);
    const int b = hadamard_block(d);
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < d; ++i) {
        const int blk = i / b;
        double want = 0.0;
        for (int j = 0; j < b; ++j) want += hadamard_entry(i % b, j, b) * x[static_cast<size_t>(h * d + blk * b + j)];
        EXPECT_NEAR(y[static_cast<size_t>(h * d + i)], want, 1e-5) << "d " << d << " head " << h << " i " << i;
      }
    }
  }
}

TEST(Hadamard, KeepsDotProductsAndUndoesItself) {
  const int heads = 4, d = 64;
  const std::vector<float> q = random_heads(heads, d, 1), k = random_heads(heads, d, 2);
  std::vector<float> qr = q, kr = k;
  hadamard_rotate_heads(qr.data(), heads, d);
  hadamard_rotate_heads(kr.data(), heads, d);
  for (int h = 0; h < heads; ++h) {
    double dot = 0.0, dot_rotated = 0.0;
    for (int i = 0; i < d; ++i) {
      const size_t e = static_cast<size_t>(h * d + i);
      dot += double{q[e]} * k[e];
      dot_rotated += double{qr[e]} * kr[e];
    }
    EXPECT_NEAR(dot_rotated, dot, 1e-4 * (1 + std::abs(dot))) << h;
  }
  hadamard_rotate_heads(qr.data(), heads, d);  // H is symmetric and orthogonal: H·H = I
  for (size_t e = 0; e < q.size(); ++e) EXPECT_NEAR(qr[e], q[e], 1e-5) << e;
}

// The reason it exists: one outlier channel, rotated, becomes b values of equal magnitude.
TEST(Hadamard, SpreadsAnOutlierChannelOverTheBlock) {
  const int d = 64;
  std::vector<float> x(d, 0.0f);
  x[5] = 64.0f;
  hadamard_rotate_heads(x.data(), 1, d);
  for (float v : x) EXPECT_NEAR(std::abs(v), 8.0f, 1e-5);  // 64 / sqrt(64)
}

}  // namespace
}  // namespace kvlm
