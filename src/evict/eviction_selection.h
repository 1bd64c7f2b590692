// eviction_selection: which slots H2O evicts and SnapKV keeps, as pure functions of attention scores.
#pragma once

#include <span>
#include <vector>

namespace kvlm {

// H2O: the num_evict slots with the smallest accumulated attention among [0, n - recent) (the
// newest `recent` slots are protected), ties going to the older slot. Slots are in token
// order, so a smaller index is older. Returns the victims in ascending order; fewer than
// num_evict when fewer slots are unprotected.
std::vector<int> h2o_victims(std::span<const float> accumulated, int recent, int num_evict);

// out[i] = max of votes over [i - kernel/2, i + kernel/2] clipped to the range: SnapKV's pooling,
// which keeps the neighbours of a strongly attended token so its phrase survives whole.
std::vector<float> max_pool_votes(std::span<const float> votes, int kernel);

// SnapKV: of n = votes.size() slots, keeps the last `window` (the observation window itself) and
// the budget - window slots of [0, n - window) with the largest pooled votes (ties to the older
// slot). Returns the kept slots ascending; every slot when n <= budget.
std::vector<int> snapkv_kept(std::span<const float> votes, int window, int kernel, int budget);

}  // namespace kvlm
