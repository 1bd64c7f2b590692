// Summary statistics of repeated measurements (bench repetitions, probe samples).
#pragma once

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

namespace kvlm {

inline double mean_of(std::span<const double> xs) {
  double sum = 0;
  for (double x : xs) sum += x;
  return xs.empty() ? 0.0 : sum / static_cast<double>(xs.size());
}

// Robust to the odd disturbed repetition on a shared machine; 0 for no samples.
inline double median_of(std::vector<double> xs) {
  if (xs.empty()) return 0.0;
  std::sort(xs.begin(), xs.end());
  const size_t n = xs.size();
  return n % 2 == 1 ? xs[n / 2] : (xs[n / 2 - 1] + xs[n / 2]) / 2;
}

// Sample standard deviation (divides by n - 1), as llama-bench reports; 0 for fewer than two samples.
inline double stddev_of(std::span<const double> xs) {
  if (xs.size() < 2) return 0.0;
  const double m = mean_of(xs);
  double sq = 0;
  for (double x : xs) sq += (x - m) * (x - m);
  return std::sqrt(sq / static_cast<double>(xs.size() - 1));
}

}  // namespace kvlm
