// rms_norm, silu_mul and softmax on every ISA this CPU runs, and rope_apply, against
// straightforward double-precision references.
#include "ops/elementwise.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "ops/elementwise_kernels.h"

namespace kvlm {
namespace {

using ops_internal::ElementwiseKernels;
using ops_internal::Isa;

std::vector<float> random_vector(int64_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

const int64_t kLengths[] = {1, 3, 8, 15, 16, 17, 33, 2048 + 5};

class ElementwiseTest : public ::testing::TestWithParam<Isa> {
 protected:
  const ElementwiseKernels& kernels() const { return ops_internal::elementwise_kernels(GetParam()); }
};

// out = x·s·w with s from a double sum: three f32 roundings at most, so 1e-6 relative.
TEST_P(ElementwiseTest, RmsNormMatchesDoubleReference) {
  for (int64_t n : kLengths) {
    const std::vector<float> x = random_vector(n, 3.0f, static_cast<uint32_t>(n));
    const std::vector<float> weight = random_vector(n, 1.0f, static_cast<uint32_t>(n + 1000));
    const float eps = 1e-5f;
    double sum = 0.0;
    for (float v : x) sum += static_cast<double>(v) * v;
    const double scale = 1.0 / std::sqrt(sum / n + eps);
    std::vector<float> out(n);
    kernels().rms_norm(x.data(), weight.data(), out.data(), n, eps);
    for (int64_t i = 0; i < n; ++i) {
      const double ref = x[i] * scale * weight[i];
      ASSERT_NEAR(out[i], ref, 1e-6 * std::fabs(ref) + 1e-30) << "n " << n << " i " << i;
    }
    std::vector<float> in_place = x;  // out may alias x
    kernels().rms_norm(in_place.data(), weight.data(), in_place.data(), n, eps);
    ASSERT_EQ(in_place, out) << "n " << n;
  }
}

TEST_P(ElementwiseTest, RmsNormOfZerosIsZeroAndEpsIsInsideTheRoot) {
  std::vector<float> x(40, 0.0f), weight(40, 1.0f), out(40, 1.0f);
  kernels().rms_norm(x.data(), weight.data(), out.data(), 40, 1e-6f);
  for (float v : out) ASSERT_EQ(v, 0.0f);
  // mean(x²) = 1 and eps = 3: the scale is 1/sqrt(4) = 0.5.
  std::vector<float> ones(40, 1.0f);
  kernels().rms_norm(ones.data(), weight.data(), out.data(), 40, 3.0f);
  for (float v : out) ASSERT_FLOAT_EQ(v, 0.5f);
}

// silu(g)·u with a polynomial exp on SIMD paths: a few ulp, so 2e-6 relative.
TEST_P(ElementwiseTest, SiluMulMatchesDoubleReference) {
  for (int64_t n : kLengths) {
    std::vector<float> gate = random_vector(n, 6.0f, static_cast<uint32_t>(n + 7));
    const std::vector<float> up = random_vector(n, 2.0f, static_cast<uint32_t>(n + 8));
    const float extremes[] = {0.0f, -0.0f, 100.0f, -100.0f, 88.0f, -88.0f, 1e-20f, -30.0f};
    for (int64_t i = 0; i < n && i < 8; ++i) gate[i * 3 % n] = extremes[i];
    std::vector<float> out(n);
    kernels().silu_mul(gate.data(), up.data(), out.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double g = gate[i];
      const double ref = g / (1.0 + std::exp(-g)) * up[i];
      ASSERT_NEAR(out[i], ref, 2e-6 * std::fabs(ref) + 1e-30) << "n " << n << " gate " << gate[i];
    }
    std::vector<float> in_place = gate;  // out may alias gate
    kernels().silu_mul(in_place.data(), up.data(), in_place.data(), n);
    ASSERT_EQ(in_place, out) << "n " << n;
  }
}

TEST_P(ElementwiseTest, SoftmaxMatchesDoubleReference) {
  for (int64_t n : kLengths) {
    std::vector<float> x = random_vector(n, 8.0f, static_cast<uint32_t>(n + 9));
    x[n / 2] += 1000.0f;  // a large max must not overflow
    double max = -INFINITY;
    for (float v : x) max = std::max<double>(max, v);
    double sum = 0.0;
    for (float v : x) sum += std::exp(v - max);
    std::vector<float> out = x;
    kernels().softmax(out.data(), n);
    double total = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const double ref = std::exp(x[i] - max) / sum;
      ASSERT_NEAR(out[i], ref, 2e-6 * ref + 1e-37) << "n " << n << " i " << i;
      total += out[i];
    }
    ASSERT_NEAR(total, 1.0, 1e-5) << "n " << n;
  }
}

TEST_P(ElementwiseTest, SoftmaxGivesMaskedEntriesExactlyZero) {
  for (int64_t n : {2, 9, 40}) {
    std::vector<float> x = random_vector(n, 1.0f, 5);
    for (int64_t i = 1; i < n; i += 2) x[i] = -INFINITY;
    kernels().softmax(x.data(), n);
    double total = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      if (i % 2 == 1) {
        ASSERT_EQ(x[i], 0.0f) << "n " << n << " i " << i;
      }
      total += x[i];
    }
    ASSERT_NEAR(total, 1.0, 1e-6);
  }
}

// The elementwise kernels have no AMX form (Isa::kAmx runs the AVX-512 ones), so that level is
// not a case of its own here.
std::vector<Isa> elementwise_isas() {
  std::vector<Isa> isas;
  for (Isa isa : ops_internal::available_isas()) {
    if (isa != Isa::kAmx) isas.push_back(isa);
  }
  return isas;
}

INSTANTIATE_TEST_SUITE_P(Isas, ElementwiseTest, ::testing::ValuesIn(elementwise_isas()),
                         [](const ::testing::TestParamInfo<Isa>& info) {
                           return std::string(ops_internal::isa_name(info.param));
                         });

TEST(Elementwise, PublicFunctionsMatchBestIsa) {
  const ElementwiseKernels& best = ops_internal::elementwise_kernels(ops_internal::best_isa());
  const int64_t n = 100;
  const std::vector<float> a = random_vector(n, 2.0f, 1);
  const std::vector<float> b = random_vector(n, 2.0f, 2);
  std::vector<float> got(n), want(n);
  rms_norm(a.data(), b.data(), got.data(), n, 1e-5f);
  best.rms_norm(a.data(), b.data(), want.data(), n, 1e-5f);
  EXPECT_EQ(got, want);
  silu_mul(a.data(), b.data(), got.data(), n);
  best.silu_mul(a.data(), b.data(), want.data(), n);
  EXPECT_EQ(got, want);
  got = a;
  want = a;
  softmax(got.data(), n);
  best.softmax(want.data(), n);
  EXPECT_EQ(got, want);
}

// ---- RoPE ----

// Straightforward reference: angle and rotation in double.
std::vector<double> rope_reference(const RopeParams& p, const std::vector<float>& x, int num_heads, Position pos) {
  std::vector<double> out(x.begin(), x.end());
  const int num_pairs = p.rotary_dim / 2;
  for (int h = 0; h < num_heads; ++h) {
    for (int i = 0; i < num_pairs; ++i) {
      const int a = h * p.head_dim + (p.style == RopeStyle::kNormal ? 2 * i : i);
      const int b = a + (p.style == RopeStyle::kNormal ? 1 : num_pairs);
      const double theta =
          static_cast<double>(pos) * p.freq_scale * std::pow(static_cast<double>(p.freq_base), -2.0 * i / p.rotary_dim);
      const double x0 = x[a];
      const double x1 = x[b];
      out[a] = x0 * std::cos(theta) - x1 * std::sin(theta);
      out[b] = x0 * std::sin(theta) + x1 * std::cos(theta);
    }
  }
  return out;
}

struct RopeCase {
  int head_dim;
  int rotary_dim;
  float freq_base;
  float freq_scale;
};

TEST(Rope, MatchesDoubleReferenceForBothStyles) {
  const RopeCase cases[] = {
      {64, 64, 10000.0f, 1.0f}, {64, 32, 10000.0f, 1.0f}, {128, 128, 500000.0f, 0.25f}, {80, 20, 1000000.0f, 1.0f}};
  const int num_heads = 3;
  for (RopeStyle style : {RopeStyle::kNormal, RopeStyle::kNeox}) {
    for (const RopeCase& c : cases) {
      const RopeParams params{c.head_dim, c.rotary_dim, c.freq_base, c.freq_scale, style};
      // Large positions: an f32 angle would be off by ~1e-2 rad there and fail the bound.
      for (Position pos : {0, 1, 17, 4095, 32768, 100000, -5}) {
        const std::vector<float> x = random_vector(num_heads * c.head_dim, 1.0f, static_cast<uint32_t>(pos + 77));
        std::vector<float> got = x;
        rope_apply(params, got.data(), num_heads, pos);
        const std::vector<double> ref = rope_reference(params, x, num_heads, pos);
        for (int i = 0; i < num_heads * c.head_dim; ++i) {
          // cos/sin rounded to f32, then two products and a sum: a few ulp of the pair's magnitude.
          ASSERT_NEAR(got[i], ref[i], 1e-6 * (std::fabs(ref[i]) + 1.0))
              << "style " << static_cast<int>(style) << " head_dim " << c.head_dim << " rotary_dim " << c.rotary_dim
              << " pos " << pos << " i " << i;
          const int d = i % c.head_dim;
          if (d >= c.rotary_dim) {
            ASSERT_EQ(got[i], x[i]) << "dims past rotary_dim must be untouched";
          }
        }
      }
    }
  }
}

TEST(Rope, PositionZeroIsIdentity) {
  for (RopeStyle style : {RopeStyle::kNormal, RopeStyle::kNeox}) {
    const RopeParams params{64, 48, 10000.0f, 1.0f, style};
    const std::vector<float> x = random_vector(4 * 64, 2.0f, 3);
    std::vector<float> got = x;
    rope_apply(params, got.data(), 4, 0);
    EXPECT_EQ(got, x);
  }
}

TEST(Rope, PreservesNormOfEveryRotatedPair) {
  for (RopeStyle style : {RopeStyle::kNormal, RopeStyle::kNeox}) {
    const RopeParams params{64, 64, 10000.0f, 1.0f, style};
    const std::vector<float> x = random_vector(2 * 64, 1.0f, 4);
    std::vector<float> got = x;
    rope_apply(params, got.data(), 2, 12345);
    for (int h = 0; h < 2; ++h) {
      for (int i = 0; i < 32; ++i) {
        const int a = h * 64 + (style == RopeStyle::kNormal ? 2 * i : i);
        const int b = a + (style == RopeStyle::kNormal ? 1 : 32);
        const double before = std::hypot(static_cast<double>(x[a]), static_cast<double>(x[b]));
        const double after = std::hypot(static_cast<double>(got[a]), static_cast<double>(got[b]));
        ASSERT_NEAR(after, before, 1e-6 * before + 1e-12) << "head " << h << " pair " << i;
      }
    }
  }
}

// Rotating by p then by q equals rotating by p + q (what re-rotating cached keys relies on).
TEST(Rope, RotationsCompose) {
  const RopeParams params{64, 64, 10000.0f, 1.0f, RopeStyle::kNeox};
  const std::vector<float> x = random_vector(64, 1.0f, 6);
  std::vector<float> twice = x;
  rope_apply(params, twice.data(), 1, 300);
  rope_apply(params, twice.data(), 1, 700);
  std::vector<float> once = x;
  rope_apply(params, once.data(), 1, 1000);
  for (int i = 0; i < 64; ++i) ASSERT_NEAR(twice[i], once[i], 2e-6) << i;
}

// The per-thread cos/sin cache must never serve a table for other parameters or positions.
TEST(Rope, InterleavedParamsAndPositionsMatchFreshCalls) {
  const RopeParams a{64, 64, 10000.0f, 1.0f, RopeStyle::kNormal};
  const RopeParams b{64, 32, 500000.0f, 0.5f, RopeStyle::kNeox};
  const std::vector<float> x = random_vector(64, 1.0f, 8);
  auto rotated = [&](const RopeParams& p, Position pos) {
    std::vector<float> v = x;
    rope_apply(p, v.data(), 1, pos);
    return v;
  };
  const std::vector<float> a5 = rotated(a, 5);
  const std::vector<float> b5 = rotated(b, 5);
  const std::vector<float> a9 = rotated(a, 9);
  EXPECT_NE(a5, b5);
  EXPECT_NE(a5, a9);
  EXPECT_EQ(rotated(a, 5), a5);
  EXPECT_EQ(rotated(b, 5), b5);
  EXPECT_EQ(rotated(a, 9), a9);
  EXPECT_EQ(rotated(b, 5), b5);
}

}  // namespace
}  // namespace kvlm
