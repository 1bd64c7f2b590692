// Sampler: picks the next token from logits (greedy, temperature, top-k, top-p, min-p, repetition penalty).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/ids.h"
#include "core/rng.h"
#include "core/status.h"

namespace kvlm {

struct SamplerParams {
  float temperature = 0.8f;    // <= 0: greedy (argmax, lowest id on ties)
  int top_k = 40;              // <= 0: off
  float top_p = 0.95f;         // >= 1: off
  float min_p = 0.05f;         // <= 0: off; keeps tokens with p >= min_p * p_max
  float repeat_penalty = 1.0f; // 1: off; CTRL-style: positive logits divided, negative multiplied
  int repeat_last_n = 64;      // how many recent tokens the penalty looks at
  uint64_t seed = 0;

  Status validate() const;     // rejects values that make no sense (negative temperature is fine: greedy)
};

// Order: repetition penalty, then (unless greedy) top-k, top-p and min-p on the
// temperature-1 distribution, then temperature over the survivors, then one draw. With no cut
// at all the draw walks the vocabulary in id order; after a cut, from the most likely survivor.
class Sampler {
 public:
  explicit Sampler(const SamplerParams& params) : params_(params), rng_(params.seed) {}

  // history: tokens of the sequence so far (for the repetition penalty).
  TokenId sample(std::span<const float> logits, std::span<const TokenId> history);

  const SamplerParams& params() const { return params_; }

 private:
  struct Candidate {
    TokenId id;
    float logit;
  };
  TokenId draw_from_all(std::span<const float> scores, float max_logit);

  SamplerParams params_;
  Rng rng_;
  std::vector<float> penalized_;       // [vocab]
  std::vector<Candidate> candidates_;  // [vocab] at most
  std::vector<double> weights_;        // [candidates]: their weights; [vocab] in draw_from_all
};

}  // namespace kvlm
