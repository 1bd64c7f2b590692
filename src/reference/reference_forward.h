// The oracle: a plain llama forward pass with no cache, recomputing everything in double precision.
// Shares nothing with the fast path but the weight bytes: its own dequantization (core/quantize.h),
// matrix products, RoPE, attention and norms. Used by tests and by `kvlm run --verify`.
#pragma once

#include <span>
#include <vector>

#include "core/ids.h"
#include "model/llama_weights.h"
#include "model/model_config.h"

namespace kvlm {

// Logits of every position: [tokens.size(), vocab], row t predicting token t+1.
std::vector<double> reference_logits(const ModelConfig& config, const LlamaWeights& weights,
                                     std::span<const TokenId> tokens);

// max_i |a_i - b_i| / max_i |b_i|: the relative error measure used for logits.
double max_relative_error(std::span<const float> actual, std::span<const double> expected);

}  // namespace kvlm
