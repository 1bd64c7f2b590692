// Mixture-of-experts FFN (deepseek2): the router's choice per token (route_tokens) and the
// routed plus shared experts' SiLU-gated FFNs over a batch (moe_ffn).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/thread_pool.h"
#include "model/gated_ffn.h"
#include "model/llama_weights.h"
#include "model/model_config.h"

namespace kvlm {

struct ExpertChoice {
  int expert = 0;
  float weight = 0.0f;
};

// The experts one token runs and their weights, from its router logits [num_experts]:
// probabilities by softmax or sigmoid; the num_experts_used best by probability + bias (the
// bias only chooses), within the best groups when routing is group-limited (a group scores the
// sum of its two best); weights are the chosen probabilities, renormalised to sum 1 when
// normalize_weights, times weights_scale. Ties go to the lower expert index. out: [used].
void route_token(const MoeConfig& moe, std::span<const float> logits, std::span<const float> bias,
                 std::vector<ExpertChoice>& out);

// Working memory, sized by the largest step so far.
struct MoeScratch {
  std::vector<float> logits;               // [n, experts]
  std::vector<std::vector<ExpertChoice>> choices;  // [n]
  std::vector<int64_t> tokens;             // one expert's tokens
  std::vector<float> weights;              // their weights
  std::vector<float> x;                    // [m, dim] their inputs
  GatedFfnScratch ffn;                     // [m, ffn] twice
  std::vector<float> y;                    // [m, dim]
};

// out[t] = sum over t's routed experts e of weight_e FFN_e(xn[t]) + the shared experts' FFN(xn[t]).
// xn, out: [n, dim]; out must not alias xn.
void moe_ffn(const ModelConfig& c, const LlamaLayerWeights& w, const float* xn, int64_t n, ThreadPool& pool,
             MoeScratch& scratch, float* out);

}  // namespace kvlm
