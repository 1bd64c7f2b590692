// The oracle of deepseek2's layers, the naive way: MLA with every head's key and value expanded
// from the latent and plain attention over them, and the MoE FFN token by token, in double.
// Internal to reference/ (reference_logits calls it for deepseek2 models).
#pragma once

#include <cstdint>
#include <vector>

#include "model/llama_weights.h"
#include "model/model_config.h"
#include "reference/reference_forward.h"

namespace kvlm::reference_internal {

// The attention block's output [n, dim] for normed inputs xn [n, dim], under `visibility` (see
// reference_logits); adds to weight_sums as reference_logits documents.
std::vector<double> mla_attention_ref(const ModelConfig& c, const LlamaLayerWeights& w, const std::vector<double>& xn,
                                      int64_t n, const ReferenceVisibility& visibility,
                                      std::vector<double>* weight_sums, int64_t first_weight_query);

// The MoE FFN's output [n, dim] (routed experts plus shared ones) for normed inputs xn [n, dim].
std::vector<double> moe_ffn_ref(const ModelConfig& c, const LlamaLayerWeights& w, const std::vector<double>& xn,
                                int64_t n);

}  // namespace kvlm::reference_internal
