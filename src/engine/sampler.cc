#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <unordered_set>

#include "core/check.h"

namespace kvlm {

Status SamplerParams::validate() const {
  if (!std::isfinite(temperature)) return Status::error("--temp must be a finite number");
  if (!(top_p > 0.0f)) return Status::errorf("--top-p {} must be in (0, 1]", top_p);
  if (min_p < 0.0f || min_p > 1.0f) return Status::errorf("--min-p {} must be in [0, 1]", min_p);
  if (!(repeat_penalty > 0.0f) || !std::isfinite(repeat_penalty)) {
    return Status::errorf("--repeat-penalty {} must be positive", repeat_penalty);
  }
  if (repeat_last_n < 0) return Status::errorf("--repeat-last-n {} must be >= 0", repeat_last_n);
  return Status::ok_status();
}

namespace {

// The first index of the largest value (std::max_element's answer), a block at a time: the
// block's maximum is taken in four vector registers (GCC/clang vector extensions, so any x86-64
// level), and only a block that beats the best so far is searched for its first maximum.
// max_element's own loop carries a load-compare-cmov chain per element, ~0.35 ms over a 128k
// vocabulary: at 16 greedy sequences a step, 5% of the step while the other threads waited.
size_t first_argmax(std::span<const float> values) {
  using Vec = float __attribute__((vector_size(16)));
  constexpr size_t kVec = 4, kBlock = 256;
  const float minus_inf = -std::numeric_limits<float>::infinity();
  size_t best = 0;
  float best_value = values[0];  // a NaN there stays the answer, as with max_element
  for (size_t start = 0; start < values.size(); start += kBlock) {
    const size_t end = std::min(values.size(), start + kBlock);
    const Vec lowest = {minus_inf, minus_inf, minus_inf, minus_inf};
    Vec m0 = lowest, m1 = lowest, m2 = lowest, m3 = lowest;
    // NaNs never win a comparison: they are skipped, as max_element skips them.
    auto update = [&](Vec& m, size_t at) {
      Vec x;
      std::memcpy(&x, values.data() + at, sizeof(x));
      m = x > m ? x : m;
    };
    size_t i = start;
    for (; i + 4 * kVec <= end; i += 4 * kVec) {
      update(m0, i);
      update(m1, i + kVec);
      update(m2, i + 2 * kVec);
      update(m3, i + 3 * kVec);
    }
    float block_max = minus_inf;
    for (; i < end; ++i) block_max = values[i] > block_max ? values[i] : block_max;
    for (const Vec& v : {m0, m1, m2, m3}) {
      for (size_t j = 0; j < kVec; ++j) block_max = v[j] > block_max ? v[j] : block_max;
    }
    if (!(block_max > best_value)) continue;
    for (size_t k = start; k < end; ++k) {
      if (values[k] == block_max) {
        best = k;
        best_value = block_max;
        break;
      }
    }
  }
  return best;
}

// The k-th largest score (1 <= k < size), a min-heap of the k best so far: one comparison per
// score for most of a vocabulary. NaNs count as -inf.
float kth_largest(std::span<const float> scores, size_t k) {
  const float minus_inf = -std::numeric_limits<float>::infinity();
  std::vector<float> heap(k);
  for (size_t i = 0; i < k; ++i) heap[i] = std::isnan(scores[i]) ? minus_inf : scores[i];
  std::make_heap(heap.begin(), heap.end(), std::greater<float>());
  for (size_t i = k; i < scores.size(); ++i) {
    if (scores[i] > heap.front()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<float>());
      heap.back() = scores[i];
      std::push_heap(heap.begin(), heap.end(), std::greater<float>());
    }
  }
  return heap.front();
}

}  // namespace

TokenId Sampler::sample(std::span<const float> logits, std::span<const TokenId> history) {
  KVLM_CHECK(!logits.empty(), "no logits to sample from");
  const bool penalize = params_.repeat_penalty != 1.0f && params_.repeat_last_n > 0;
  // Ties go to the lowest id.
  if (params_.temperature <= 0.0f && !penalize) return static_cast<TokenId>(first_argmax(logits));
  penalized_.assign(logits.begin(), logits.end());
  if (penalize) {
    const size_t n = std::min(history.size(), static_cast<size_t>(params_.repeat_last_n));
    std::unordered_set<TokenId> seen(history.end() - static_cast<std::ptrdiff_t>(n), history.end());
    for (TokenId id : seen) {
      if (id < 0 || static_cast<size_t>(id) >= penalized_.size()) continue;
      float& l = penalized_[static_cast<size_t>(id)];
      l = l > 0 ? l / params_.repeat_penalty : l * params_.repeat_penalty;
    }
  }
  const std::span<const float> scores = penalize ? std::span<const float>(penalized_) : logits;
  if (params_.temperature <= 0.0f) return static_cast<TokenId>(first_argmax(scores));

  const size_t vocab = scores.size();
  const size_t best = first_argmax(scores);
  const float max_logit = scores[best];
  if (!std::isfinite(max_logit)) return static_cast<TokenId>(best);  // nothing to weigh
  const bool top_k = params_.top_k > 0 && static_cast<size_t>(params_.top_k) < vocab;
  if (!top_k && params_.top_p >= 1.0f && params_.min_p <= 0.0f) return draw_from_all(scores, max_logit);

  // The survivors are a prefix of the tokens in descending-logit order (ties: lower id first):
  // top-k, top-p and min-p each cut that order. Only the tokens a cut can keep are sorted.
  auto by_logit = [](const Candidate& a, const Candidate& b) {
    return a.logit != b.logit ? a.logit > b.logit : a.id < b.id;
  };
  // weights_[i]: candidate i's temperature-1 weight relative to the best (exp(0) = 1), each
  // computed once for top-p, min-p and the check that the top-p mass is inside; the sum.
  auto weigh_candidates = [&] {
    weights_.resize(candidates_.size());
    double sum = 0;
    for (size_t i = 0; i < candidates_.size(); ++i) {
      sum += (weights_[i] = std::exp(static_cast<double>(candidates_[i].logit - max_logit)));
    }
    return sum;
  };
  // top-p's probabilities are normalised over the top-k tokens, or over all of them.
  double normaliser = 0;
  candidates_.clear();
  if (top_k) {
    const size_t k = static_cast<size_t>(params_.top_k);
    const float kth = kth_largest(scores, k);
    for (size_t i = 0; i < vocab; ++i) {
      if (scores[i] > kth) candidates_.push_back({static_cast<TokenId>(i), scores[i]});
    }
    for (size_t i = 0; i < vocab && candidates_.size() < k; ++i) {  // ties at the k-th: lower ids
      if (scores[i] == kth) candidates_.push_back({static_cast<TokenId>(i), scores[i]});
    }
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
    normaliser = weigh_candidates();
  } else {
    if (params_.top_p < 1.0f) {
      for (float l : scores) normaliser += std::exp(static_cast<double>(l - max_logit));
    }
    // Tokens within `reach` of the best logit, widened until the top-p mass is inside (a token
    // e^-16 below the best weighs 1e-7 of it, so one pass almost always does), or only those
    // that min-p can keep (weight ratio >= min_p; the exact test follows below).
    float reach = 16.0f;
    if (params_.min_p > 0.0f) reach = static_cast<float>(-std::log(static_cast<double>(params_.min_p))) + 1e-3f;
    for (;;) {
      const float floor = max_logit - reach;
      candidates_.clear();
      for (size_t i = 0; i < vocab; ++i) {
        if (scores[i] >= floor) candidates_.push_back({static_cast<TokenId>(i), scores[i]});
      }
      std::sort(candidates_.begin(), candidates_.end(), by_logit);
      const double mass = weigh_candidates();
      if (params_.top_p >= 1.0f || params_.min_p > 0.0f || candidates_.size() == vocab) break;
      if (mass >= params_.top_p * normaliser) break;
      reach = reach * 2 + 16.0f;
    }
  }
  size_t keep = candidates_.size();
  if (params_.top_p < 1.0f) {
    double cumulative = 0;
    for (size_t i = 0; i < keep; ++i) {
      cumulative += weights_[i] / normaliser;
      if (cumulative >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (params_.min_p > 0.0f) {
    // p_i >= min_p * p_max, with p_max's weight 1.
    size_t cut = 1;
    while (cut < keep && weights_[cut] >= params_.min_p) ++cut;
    keep = cut;
  }

  // Temperature reshapes the survivors, then one draw, walking them from the most likely.
  double total = 0;
  for (size_t i = 0; i < keep; ++i) {
    total += (weights_[i] = std::exp(static_cast<double>(candidates_[i].logit - max_logit) / params_.temperature));
  }
  double r = rng_.next_double() * total;
  for (size_t i = 0; i < keep; ++i) {
    r -= weights_[i];
    if (r < 0) return candidates_[i].id;
  }
  return candidates_[keep - 1].id;
}

// No cut: every token is a survivor, drawn in id order (the distribution does not depend on the
// order, and sorting a 128k vocabulary cost ~15 ms a token). Weights in float: exp of a float
// difference, summed in double.
TokenId Sampler::draw_from_all(std::span<const float> scores, float max_logit) {
  const float inverse_temperature = 1.0f / params_.temperature;
  weights_.resize(scores.size());
  double total = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    weights_[i] = std::exp((scores[i] - max_logit) * inverse_temperature);
    total += weights_[i];
  }
  double r = rng_.next_double() * total;
  size_t last_positive = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    if (weights_[i] <= 0.0f) continue;
    last_positive = i;
    r -= weights_[i];
    if (r < 0) return static_cast<TokenId>(i);
  }
  return static_cast<TokenId>(last_positive);  // rounding left r >= 0: the last token with weight
}

}  // namespace kvlm
