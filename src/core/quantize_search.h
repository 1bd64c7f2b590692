// Scale searches the block quantizers share (quantize_*.cc): for one group of values, the
// scale (and min) whose codes give the least squared error, over a few candidates each refit
// by least squares. Internal to core/.
#pragma once

#include <cmath>
#include <cstdint>

namespace kvlm::quant_search {

// x ≈ d·q, q integer in [qmin, qmax] (qmin < 0 < qmax). Writes q; returns d (0 for a zero group).
float fit_symmetric(const float* x, int n, int qmin, int qmax, int8_t* q);

// x ≈ d·q + m, q in [0, qmax]. With kNonPositiveMin the offset is kept ≤ 0 (the K-quants
// store -m as an unsigned multiple of dmin). Writes q, d ≥ 0 and m.
enum class MinRule { kAny, kNonPositiveMin };
void fit_affine(const float* x, int n, int qmax, MinRule rule, uint8_t* q, float* d, float* m);

// x ≈ d·grid[idx], grid: 16 sorted values. Writes idx; returns d.
float fit_grid(const float* x, int n, const int8_t* grid, uint8_t* idx);

// The index of the grid value nearest v (grid: 16 sorted values).
int nearest_grid_index(const int8_t* grid, float v);

// Nearest integer to v within [lo, hi] (ties away from zero; nan gives lo).
inline int clamp_round(float v, int lo, int hi) {
  if (!(v > static_cast<float>(lo))) return lo;
  if (v >= static_cast<float>(hi)) return hi;
  return static_cast<int>(std::lround(v));
}

}  // namespace kvlm::quant_search
