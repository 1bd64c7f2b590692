// The oracle: a plain llama forward pass with no cache, recomputing everything in double precision.
// Shares nothing with the fast path but the weight bytes: its own dequantization (core/quantize.h),
// matrix products, RoPE, attention and norms. Used by tests and by `kvlm run --verify`.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/ids.h"
#include "model/llama_weights.h"
#include "model/model_config.h"

namespace kvlm {

// Logits of every position: [tokens.size(), vocab], row t predicting token t+1.
std::vector<double> reference_logits(const ModelConfig& config, const LlamaWeights& weights,
                                     std::span<const TokenId> tokens);

// What an evicting cache lets each query see, for the oracle of eviction (evict/): query t sees
// key s <= t when visible(t, s), and scores it with the query rotated at query_position(t, s)
// (StreamingLLM rotates queries for the sinks at their position within the cache). Keys are
// rotated at their own position, always.
struct ReferenceVisibility {
  std::function<bool(int64_t query, int64_t key)> visible;             // empty: every key <= query
  std::function<int64_t(int64_t query, int64_t key)> query_position;  // empty: the query's own position
};

// As above, with a visibility rule: one pass over all tokens, each row attending only to what
// the rule shows it. Every token's K/V at every layer then come from its own restricted view,
// exactly as when a cache evicts between steps. Each row must see at least one key.
// When `weight_sums` is given, it receives per key s ([tokens.size()]) the attention weight that
// queries [first_weight_query, n) give s, summed over those queries, all heads and all layers:
// the oracle of the side pass H2O and SnapKV ask the model for.
std::vector<double> reference_logits(const ModelConfig& config, const LlamaWeights& weights,
                                     std::span<const TokenId> tokens, const ReferenceVisibility& visibility,
                                     std::vector<double>* weight_sums = nullptr, int64_t first_weight_query = 0);

// max_i |a_i - b_i| / max_i |b_i|: the relative error measure used for logits.
double max_relative_error(std::span<const float> actual, std::span<const double> expected);

}  // namespace kvlm
