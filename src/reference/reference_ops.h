// The oracle's own arithmetic, in double: weight products (its own dequantization), RMSNorm and
// RoPE written from the scaling rules. Internal to reference/.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "model/llama_weights.h"
#include "core/quantize.h"
#include "ops/elementwise.h"

namespace kvlm::reference_internal {

// out[t][r] = sum_c W[r][c] * x[t][c]; each weight row is dequantized once for all tokens.
// x: [n, cols], out: [n, rows]
inline std::vector<double> matmul_ref(const WeightMatrix& w, const std::vector<double>& x, int64_t n) {
  std::vector<double> out(static_cast<size_t>(n * w.rows));
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    dequantize_row_reference(w.type, w.data + r * w.row_bytes, row.data(), w.cols);
    for (int64_t t = 0; t < n; ++t) {
      double acc = 0;
      const double* xt = &x[static_cast<size_t>(t * w.cols)];
      for (int64_t c = 0; c < w.cols; ++c) acc += static_cast<double>(row[static_cast<size_t>(c)]) * xt[c];
      out[static_cast<size_t>(t * w.rows + r)] = acc;
    }
  }
  return out;
}

inline std::vector<double> rms_norm_ref(const std::vector<double>& x, const std::vector<float>& weight, int64_t n, float eps) {
  const size_t dim = weight.size();
  std::vector<double> out(x.size());
  for (int64_t t = 0; t < n; ++t) {
    const double* xt = &x[static_cast<size_t>(t) * dim];
    double ss = 0;
    for (size_t i = 0; i < dim; ++i) ss += xt[i] * xt[i];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(dim) + eps);
    for (size_t i = 0; i < dim; ++i) out[static_cast<size_t>(t) * dim + i] = xt[i] * inv * weight[i];
  }
  return out;
}

// Rotates one head in place; pair layout per RoPE style. Written from the scaling rules, not
// through ops' rope_pair_frequencies: Llama 3 factors divide the frequency; YaRN blends the
// interpolated and the original frequency of each pair by a ramp between the pairs turning
// beta_fast and beta_slow times over the original context, and scales cos and sin.
inline void rope_ref(const RopeParams& p, double* head, int64_t pos) {
  const int half = p.rotary_dim / 2;
  const bool yarn = p.yarn.ext_factor != 0.0f;
  double low = 0, high = 0, magnitude = p.yarn.attn_factor;
  if (yarn) {
    const double ctx = p.yarn.original_context;
    auto dim_for_turns = [&](double turns) {
      // Pair i turns ctx · base^(-2i/d) / 2π times over the original context; solve for i.
      return p.rotary_dim * std::log(ctx / (2.0 * 3.14159265358979323846 * turns)) / (2.0 * std::log(p.freq_base));
    };
    low = std::max(0.0, std::floor(dim_for_turns(p.yarn.beta_fast)));
    high = std::min(p.rotary_dim - 1.0, std::ceil(dim_for_turns(p.yarn.beta_slow)));
    magnitude *= 1.0 + 0.1 * std::log(1.0 / static_cast<double>(p.freq_scale));
  }
  for (int i = 0; i < half; ++i) {
    double inv_freq = std::pow(static_cast<double>(p.freq_base), -2.0 * i / p.rotary_dim);
    if (!p.freq_factors.empty()) inv_freq /= static_cast<double>(p.freq_factors[static_cast<size_t>(i)]);
    const double original = static_cast<double>(pos) * inv_freq;
    double angle = original * p.freq_scale;
    if (yarn) {
      const double ramp = 1.0 - std::min(1.0, std::max(0.0, (i - low) / std::max(0.001, high - low)));
      const double mix = ramp * p.yarn.ext_factor;
      angle = angle * (1.0 - mix) + original * mix;
    }
    const int a = p.style == RopeStyle::kNormal ? 2 * i : i;
    const int b = p.style == RopeStyle::kNormal ? 2 * i + 1 : i + half;
    const double x0 = head[a], x1 = head[b];
    const double cs = std::cos(angle) * magnitude, sn = std::sin(angle) * magnitude;
    head[a] = x0 * cs - x1 * sn;
    head[b] = x0 * sn + x1 * cs;
  }
}

}  // namespace kvlm::reference_internal
