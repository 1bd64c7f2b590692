#include "core/quantize_search.h"

#include <algorithm>
#include <cmath>

namespace kvlm::quant_search {
namespace {

// Candidate scales put the value of largest magnitude at `level + k / 10` for k in
// [-kSteps, kSteps]: the best code assignment is usually a little past or short of the
// extreme level, and the least-squares refit of each candidate does the fine tuning.
constexpr int kSteps = 10;

double squared_error_symmetric(const float* x, int n, float d, const int8_t* q) {
  double e = 0.0;
  for (int i = 0; i < n; ++i) {
    const double r = static_cast<double>(x[i]) - static_cast<double>(d) * q[i];
    e += r * r;
  }
  return e;
}

}  // namespace

float fit_symmetric(const float* x, int n, int qmin, int qmax, int8_t* q) {
  float xm = 0.0f;  // the value of largest magnitude, with its sign
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > std::fabs(xm)) xm = x[i];
  }
  if (xm == 0.0f) {
    std::fill(q, q + n, int8_t{0});
    return 0.0f;
  }
  int8_t trial[256];
  float best_d = 0.0f;
  double best_err = INFINITY;
  auto consider = [&](float d) {
    if (!(d != 0.0f) || !std::isfinite(d)) return;
    for (int pass = 0; pass < 2; ++pass) {
      const float inv = 1.0f / d;
      double xq = 0.0, qq = 0.0;
      for (int i = 0; i < n; ++i) {
        trial[i] = static_cast<int8_t>(clamp_round(x[i] * inv, qmin, qmax));
        xq += static_cast<double>(x[i]) * trial[i];
        qq += static_cast<double>(trial[i]) * trial[i];
      }
      const float refit = qq > 0.0 ? static_cast<float>(xq / qq) : d;
      const double err = squared_error_symmetric(x, n, refit, trial);
      if (err < best_err) {
        best_err = err;
        best_d = refit;
        std::copy(trial, trial + n, q);
      }
      d = refit;  // second pass: codes re-rounded with the refit scale
    }
  };
  // xm on the positive or on the negative extreme level (the wider side first).
  for (int k = -kSteps; k <= kSteps; ++k) {
    consider(xm / (static_cast<float>(qmin) + 0.1f * k));
    consider(xm / (static_cast<float>(qmax) + 0.1f * k));
  }
  // Leave q consistent with best_d exactly as the callers will store it.
  return best_d;
}

void fit_affine(const float* x, int n, int qmax, MinRule rule, uint8_t* q, float* d_out, float* m_out) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  if (rule == MinRule::kNonPositiveMin) lo = std::min(lo, 0.0f);
  if (hi <= lo) {  // constant group: all codes 0, the value in m (or in d·1 when m must stay ≤ 0)
    std::fill(q, q + n, uint8_t{0});
    if (rule == MinRule::kNonPositiveMin && lo > 0.0f) {
      std::fill(q, q + n, uint8_t{1});
      *d_out = lo;
      *m_out = 0.0f;
    } else {
      *d_out = 0.0f;
      *m_out = lo;
    }
    return;
  }
  uint8_t trial[256];
  double best_err = INFINITY;
  *d_out = (hi - lo) / static_cast<float>(qmax);
  *m_out = lo;
  auto consider = [&](float d, float m) {
    for (int pass = 0; pass < 2; ++pass) {
      if (!(d > 0.0f) || !std::isfinite(d)) return;
      const float inv = 1.0f / d;
      double sq = 0, sqq = 0, sx = 0, sxq = 0;
      for (int i = 0; i < n; ++i) {
        trial[i] = static_cast<uint8_t>(clamp_round((x[i] - m) * inv, 0, qmax));
        sq += trial[i];
        sqq += static_cast<double>(trial[i]) * trial[i];
        sx += x[i];
        sxq += static_cast<double>(x[i]) * trial[i];
      }
      // Least squares for (d, m) given the codes: [sqq sq; sq n]·[d; m] = [sxq; sx].
      const double det = sqq * n - sq * sq;
      double fd = d, fm = m;
      if (det > 0.0) {
        fd = (sxq * n - sq * sx) / det;
        fm = (sqq * sx - sq * sxq) / det;
      }
      if (rule == MinRule::kNonPositiveMin && fm > 0.0) {
        fm = 0.0;
        fd = sqq > 0.0 ? sxq / sqq : d;
      }
      if (!(fd > 0.0)) return;
      double err = 0.0;
      for (int i = 0; i < n; ++i) {
        const double r = x[i] - (fd * trial[i] + fm);
        err += r * r;
      }
      if (err < best_err) {
        best_err = err;
        *d_out = static_cast<float>(fd);
        *m_out = static_cast<float>(fm);
        std::copy(trial, trial + n, q);
      }
      d = static_cast<float>(fd);
      m = static_cast<float>(fm);
    }
  };
  for (int k = -kSteps; k <= kSteps; ++k) {
    consider((hi - lo) / (static_cast<float>(qmax) + 0.1f * k), lo);
  }
}

int nearest_grid_index(const int8_t* grid, float v) {
  int idx = 0;
  while (idx < 15 && v > 0.5f * (grid[idx] + grid[idx + 1])) ++idx;
  return idx;
}

float fit_grid(const float* x, int n, const int8_t* grid, uint8_t* idx) {
  float xm = 0.0f;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > std::fabs(xm)) xm = x[i];
  }
  if (xm == 0.0f) {
    // The grid has no 0: the code nearest 0 (value 1) with d = 0 decodes to 0 exactly.
    std::fill(idx, idx + n, static_cast<uint8_t>(nearest_grid_index(grid, 0.0f)));
    return 0.0f;
  }
  uint8_t trial[256];
  float best_d = 0.0f;
  double best_err = INFINITY;
  auto consider = [&](float d) {
    for (int pass = 0; pass < 2; ++pass) {
      if (!(d != 0.0f) || !std::isfinite(d)) return;
      const float inv = 1.0f / d;
      double xg = 0.0, gg = 0.0;
      for (int i = 0; i < n; ++i) {
        trial[i] = static_cast<uint8_t>(nearest_grid_index(grid, x[i] * inv));
        xg += static_cast<double>(x[i]) * grid[trial[i]];
        gg += static_cast<double>(grid[trial[i]]) * grid[trial[i]];
      }
      const float refit = gg > 0.0 ? static_cast<float>(xg / gg) : d;
      double err = 0.0;
      for (int i = 0; i < n; ++i) {
        const double r = x[i] - static_cast<double>(refit) * grid[trial[i]];
        err += r * r;
      }
      if (err < best_err) {
        best_err = err;
        best_d = refit;
        std::copy(trial, trial + n, idx);
      }
      d = refit;
    }
  };
  // xm at either end of the grid (-127 or 113), shifted by up to ±10 grid units.
  for (int k = -kSteps; k <= kSteps; ++k) {
    consider(xm / (static_cast<float>(grid[0]) + 1.0f * k));
    consider(xm / (static_cast<float>(grid[15]) + 1.0f * k));
  }
  return best_d;
}

}  // namespace kvlm::quant_search
