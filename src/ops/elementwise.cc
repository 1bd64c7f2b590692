// Elementwise ops: argument checks, ISA dispatch, the portable kernels, and RoPE.
#include "ops/elementwise.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "core/check.h"
#include "ops/elementwise_kernels.h"

namespace kvlm {
namespace ops_internal {
namespace {

void rms_norm_portable(const float* x, const float* weight, float* out, int64_t n, float eps) {
  // Four double partial sums: exact enough for any n, and independent of the SIMD paths' order.
  double partial[4] = {0.0, 0.0, 0.0, 0.0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int k = 0; k < 4; ++k) partial[k] += static_cast<double>(x[i + k]) * x[i + k];
  }
  double sum = (partial[0] + partial[1]) + (partial[2] + partial[3]);
  for (; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  const float scale = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(n) + eps));
  for (int64_t j = 0; j < n; ++j) out[j] = x[j] * scale * weight[j];
}

void silu_mul_portable(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void softmax_portable(float* x, int64_t n) {
  float max = x[0];
  for (int64_t i = 1; i < n; ++i) max = std::fmax(max, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

// cos/sin of every rotated pair for one (params, position): decode rotates q and k of every
// layer at the same position, so the last table of each thread is reused; thread_local keeps
// it safe without locks.
struct RopeTable {
  RopeParams params;
  bool valid = false;
  Position pos = 0;
  std::vector<double> freq;  // [rotary_dim / 2] rope_pair_frequencies
  double magnitude = 1.0;
  std::vector<float> cos;    // [rotary_dim / 2]
  std::vector<float> sin;    // [rotary_dim / 2]

  static bool same_frequencies(const RopeParams& a, const RopeParams& b) {
    return a.rotary_dim == b.rotary_dim && a.freq_base == b.freq_base && a.freq_scale == b.freq_scale &&
           a.freq_factors == b.freq_factors && a.yarn.ext_factor == b.yarn.ext_factor &&
           a.yarn.attn_factor == b.yarn.attn_factor && a.yarn.beta_fast == b.yarn.beta_fast &&
           a.yarn.beta_slow == b.yarn.beta_slow && a.yarn.original_context == b.yarn.original_context;
  }

  void prepare(const RopeParams& p, Position position) {
    const bool same_freqs = valid && same_frequencies(params, p);
    if (same_freqs && pos == position) return;
    if (!same_freqs) {
      params = p;
      freq = rope_pair_frequencies(p);
      magnitude = rope_magnitude(p);
      cos.resize(freq.size());
      sin.resize(freq.size());
      valid = true;
    }
    pos = position;
    // In double: at positions near 1e5 an f32 angle would be off by ~0.01 rad.
    for (size_t i = 0; i < freq.size(); ++i) {
      const double theta = static_cast<double>(position) * freq[i];
      cos[i] = static_cast<float>(std::cos(theta) * magnitude);
      sin[i] = static_cast<float>(std::sin(theta) * magnitude);
    }
  }
};

}  // namespace

const ElementwiseKernels& elementwise_kernels_portable() {
  static const ElementwiseKernels kernels{rms_norm_portable, silu_mul_portable, softmax_portable};
  return kernels;
}

const ElementwiseKernels& elementwise_kernels(Isa isa) {
  KVLM_CHECK(isa_supported(isa), "elementwise ISA {} is not supported by this CPU", isa_name(isa));
  switch (isa) {
    case Isa::kAvx2:
      return elementwise_kernels_avx2();
    case Isa::kAvx512:
    case Isa::kAmx:  // no tile work here
      return elementwise_kernels_avx512();
    case Isa::kPortable:
      break;
  }
  return elementwise_kernels_portable();
}

}  // namespace ops_internal

namespace {
const ops_internal::ElementwiseKernels& best_kernels() {
  static const ops_internal::ElementwiseKernels& kernels = ops_internal::elementwise_kernels(ops_internal::best_isa());
  return kernels;
}
}  // namespace

void rms_norm(const float* x, const float* weight, float* out, int64_t n, float eps) {
  KVLM_CHECK(n > 0 && x != nullptr && weight != nullptr && out != nullptr, "rms_norm: n={}", n);
  KVLM_CHECK(eps >= 0.0f, "rms_norm: eps {} < 0", eps);
  best_kernels().rms_norm(x, weight, out, n, eps);
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  KVLM_CHECK(n >= 0, "silu_mul: n={}", n);
  if (n == 0) return;
  KVLM_CHECK(gate != nullptr && up != nullptr && out != nullptr, "silu_mul: null operand");
  best_kernels().silu_mul(gate, up, out, n);
}

void softmax(float* x, int64_t n) {
  KVLM_CHECK(n >= 0, "softmax: n={}", n);
  if (n == 0) return;
  KVLM_CHECK(x != nullptr, "softmax: null operand");
  best_kernels().softmax(x, n);
}

std::vector<double> rope_pair_frequencies(const RopeParams& p) {
  const int num_pairs = p.rotary_dim / 2;
  KVLM_CHECK(p.freq_factors.empty() || static_cast<int>(p.freq_factors.size()) == num_pairs,
             "rope: {} frequency factors for {} pairs", p.freq_factors.size(), num_pairs);
  // YaRN's ramp runs over the pair index between the pairs that turn beta_fast and beta_slow
  // times over the original context: pair i turns ctx · f_i / 2π times, f_i = base^(-2i/d).
  double ramp_low = 0.0, ramp_high = 0.0;
  if (p.yarn.ext_factor != 0.0f) {
    auto pair_turning = [&](double turns) {
      return p.rotary_dim * std::log(p.yarn.original_context / (turns * 2.0 * std::numbers::pi)) / (2.0 * std::log(p.freq_base));
    };
    ramp_low = std::max(0.0, std::floor(pair_turning(p.yarn.beta_fast)));
    ramp_high = std::min(static_cast<double>(p.rotary_dim - 1), std::ceil(pair_turning(p.yarn.beta_slow)));
  }
  std::vector<double> freq(static_cast<size_t>(num_pairs));
  for (int i = 0; i < num_pairs; ++i) {
    double f = std::pow(static_cast<double>(p.freq_base), -2.0 * i / p.rotary_dim);
    if (!p.freq_factors.empty()) f /= p.freq_factors[static_cast<size_t>(i)];
    const double interpolated = f * p.freq_scale;
    if (p.yarn.ext_factor == 0.0f) {
      freq[static_cast<size_t>(i)] = interpolated;
      continue;
    }
    const double y = (i - ramp_low) / std::max(0.001, ramp_high - ramp_low);
    const double keep = (1.0 - std::clamp(y, 0.0, 1.0)) * p.yarn.ext_factor;  // 1: the original frequency
    freq[static_cast<size_t>(i)] = interpolated * (1.0 - keep) + f * keep;
  }
  return freq;
}

double rope_magnitude(const RopeParams& p) {
  if (p.yarn.ext_factor == 0.0f) return p.yarn.attn_factor;
  return p.yarn.attn_factor * (1.0 + 0.1 * std::log(1.0 / p.freq_scale));
}

// Scalar on every ISA: a few tanh per FFN value, next to the matmuls' thousands of MACs.
void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  for (int64_t i = 0; i < n; ++i) {
    const float x = gate[i];
    out[i] = 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x))) * up[i];
  }
}

void rope_apply(const RopeParams& params, float* x, int num_heads, Position pos) {
  KVLM_CHECK(params.rotary_dim > 0 && params.rotary_dim % 2 == 0 && params.rotary_dim <= params.head_dim,
             "rope: rotary_dim {} must be even and in (0, head_dim={}]", params.rotary_dim, params.head_dim);
  KVLM_CHECK(params.freq_base > 0.0f && std::isfinite(params.freq_base) && std::isfinite(params.freq_scale),
             "rope: freq_base {} freq_scale {}", params.freq_base, params.freq_scale);
  KVLM_CHECK(num_heads >= 0 && (num_heads == 0 || x != nullptr), "rope: num_heads {}", num_heads);
  thread_local ops_internal::RopeTable table;
  table.prepare(params, pos);
  const int num_pairs = params.rotary_dim / 2;
  // kNormal rotates (2i, 2i+1); kNeox rotates (i, i + rotary_dim/2).
  const int stride = params.style == RopeStyle::kNormal ? 2 : 1;
  const int partner = params.style == RopeStyle::kNormal ? 1 : num_pairs;
  for (int h = 0; h < num_heads; ++h) {
    float* head = x + static_cast<int64_t>(h) * params.head_dim;
    for (int i = 0; i < num_pairs; ++i) {
      float* a = head + i * stride;
      float* b = a + partner;
      const float c = table.cos[i];
      const float s = table.sin[i];
      const float x0 = *a;
      const float x1 = *b;
      *a = x0 * c - x1 * s;
      *b = x0 * s + x1 * c;
    }
  }
}

}  // namespace kvlm
