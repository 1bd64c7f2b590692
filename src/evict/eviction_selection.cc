#include "evict/eviction_selection.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"

namespace kvlm {
namespace {

// The k indices of [0, n) with the smallest (want_smallest) or largest key, ties to the smaller
// index, returned ascending.
template <class Key>
std::vector<int> extreme_indices(int n, int k, bool want_smallest, Key key) {
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  k = std::clamp(k, 0, n);
  auto better = [&](int a, int b) {
    const float ka = key(a);
    const float kb = key(b);
    if (ka != kb) return want_smallest ? ka < kb : ka > kb;
    return a < b;
  };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), better);
  order.resize(static_cast<size_t>(k));
  std::sort(order.begin(), order.end());
  return order;
}

}  // namespace

std::vector<int> h2o_victims(std::span<const float> accumulated, int recent, int num_evict) {
  const int n = static_cast<int>(accumulated.size());
  KVLM_CHECK(recent >= 0 && num_evict >= 0, "h2o_victims: recent {} num_evict {}", recent, num_evict);
  const int candidates = std::max(0, n - recent);
  return extreme_indices(candidates, num_evict, /*want_smallest=*/true,
                         [&](int i) { return accumulated[static_cast<size_t>(i)]; });
}

std::vector<float> max_pool_votes(std::span<const float> votes, int kernel) {
  KVLM_CHECK(kernel >= 1 && kernel % 2 == 1, "max_pool_votes: kernel {} must be odd", kernel);
  const int n = static_cast<int>(votes.size());
  const int half = kernel / 2;
  std::vector<float> out(votes.size());
  for (int i = 0; i < n; ++i) {
    const int lo = std::max(0, i - half);
    const int hi = std::min(n, i + half + 1);
    out[static_cast<size_t>(i)] = *std::max_element(votes.begin() + lo, votes.begin() + hi);
  }
  return out;
}

std::vector<int> snapkv_kept(std::span<const float> votes, int window, int kernel, int budget) {
  const int n = static_cast<int>(votes.size());
  KVLM_CHECK(window >= 0 && window < budget, "snapkv_kept: window {} budget {}", window, budget);
  std::vector<int> kept;
  if (n <= budget) {
    kept.resize(static_cast<size_t>(n));
    std::iota(kept.begin(), kept.end(), 0);
    return kept;
  }
  const int prefix = n - window;
  const std::vector<float> pooled = max_pool_votes(votes.first(static_cast<size_t>(prefix)), kernel);
  kept = extreme_indices(prefix, budget - window, /*want_smallest=*/false,
                         [&](int i) { return pooled[static_cast<size_t>(i)]; });
  for (int i = prefix; i < n; ++i) kept.push_back(i);
  return kept;
}

}  // namespace kvlm
