// MLA the way it is written, not absorbed: every step reads the sequence's cached latent rows,
// expands each head's key and value from them (W_UK_h c, W_UV_h c) and attends over those. It
// costs context × heads × (nope + v) × kv_lora multiply-adds per layer and step where the absorbed
// form reads the rows once; kvlm keeps it to measure that (kvlm bench --mla expanded) and as the
// second computation the absorbed path is tested against. Plain causal attention only: no sinks,
// eviction windows or attention weights.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/thread_pool.h"
#include "model/llama_weights.h"
#include "model/model_config.h"

namespace kvlm {

class KvStorage;

// How a deepseek2 model computes attention.
enum class MlaMode {
  kAbsorbed,  // queries through W_UK_hᵀ, MQA over the cached rows, W_UV_h after (the default)
  kExpanded,  // keys and values expanded per head from the cached latents every step
};
const char* mla_mode_name(MlaMode mode);

struct MlaExpandedScratch {
  std::vector<float> latents;  // [context, kv_lora]
  std::vector<float> k_rope;   // [context, rope]
  std::vector<float> kv;       // [context, heads * (nope + v)]
  std::vector<float> row;      // [kv_lora + rope]
  // W_UK_h and W_UV_h stacked as attn_kv_b is, per layer, for files with attn_k_b / attn_v_b
  // (f32, made on first use).
  std::vector<std::vector<float>> kv_b;
};

// heads_out[i] = [head h's attention output (v values) for every h] for the last `num_queries` of
// the sequence's `num_context` cached tokens (their rows already written to `layer`). q: the
// queries from mla_queries ([num_queries, heads, nope + rope], RoPE part unrotated); positions:
// the queries' text positions (the tokens' are their slots).
void mla_expanded_attention(const ModelConfig& c, const LlamaLayerWeights& w, const KvStorage& cache, int layer,
                            std::span<const int32_t> block_table, int num_context, int num_queries, const float* q,
                            const int64_t* positions, ThreadPool& pool, MlaExpandedScratch& scratch,
                            float* heads_out);

}  // namespace kvlm
