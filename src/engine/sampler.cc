#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
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

TokenId Sampler::sample(std::span<const float> logits, std::span<const TokenId> history) {
  KVLM_CHECK(!logits.empty(), "no logits to sample from");
  penalized_.assign(logits.begin(), logits.end());
  if (params_.repeat_penalty != 1.0f && params_.repeat_last_n > 0) {
    const size_t n = std::min(history.size(), static_cast<size_t>(params_.repeat_last_n));
    std::unordered_set<TokenId> seen(history.end() - static_cast<std::ptrdiff_t>(n), history.end());
    for (TokenId id : seen) {
      if (id < 0 || static_cast<size_t>(id) >= penalized_.size()) continue;
      float& l = penalized_[static_cast<size_t>(id)];
      l = l > 0 ? l / params_.repeat_penalty : l * params_.repeat_penalty;
    }
  }
  if (params_.temperature <= 0.0f) {
    // max_element returns the first maximum: ties go to the lowest id.
    return static_cast<TokenId>(std::max_element(penalized_.begin(), penalized_.end()) - penalized_.begin());
  }

  candidates_.clear();
  for (size_t i = 0; i < penalized_.size(); ++i) candidates_.push_back({static_cast<TokenId>(i), penalized_[i]});
  auto by_logit = [](const Candidate& a, const Candidate& b) {
    return a.logit != b.logit ? a.logit > b.logit : a.id < b.id;
  };
  size_t keep = candidates_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) {
    keep = static_cast<size_t>(params_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + static_cast<std::ptrdiff_t>(keep), candidates_.end(),
                      by_logit);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  candidates_.resize(keep);

  // Probabilities at temperature 1 decide top-p and min-p.
  const float max_logit = candidates_.front().logit;
  std::vector<double> probs(keep);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += (probs[i] = std::exp(static_cast<double>(candidates_[i].logit - max_logit)));
  for (double& p : probs) p /= sum;
  if (params_.top_p < 1.0f) {
    double cumulative = 0;
    size_t cut = keep;
    for (size_t i = 0; i < keep; ++i) {
      cumulative += probs[i];
      if (cumulative >= params_.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
  }
  if (params_.min_p > 0.0f) {
    const double threshold = params_.min_p * probs.front();
    size_t cut = 1;
    while (cut < keep && probs[cut] >= threshold) ++cut;
    keep = cut;
  }

  // Temperature reshapes the survivors, then one draw.
  std::vector<double> weights(keep);
  double total = 0;
  for (size_t i = 0; i < keep; ++i) {
    total += (weights[i] = std::exp(static_cast<double>(candidates_[i].logit - max_logit) / params_.temperature));
  }
  double r = rng_.next_double() * total;
  for (size_t i = 0; i < keep; ++i) {
    r -= weights[i];
    if (r < 0) return candidates_[i].id;
  }
  return candidates_[keep - 1].id;
}

}  // namespace kvlm
