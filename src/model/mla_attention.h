// Multi-head latent attention (deepseek2), absorbed: the projections around the cached row.
// The model writes each token's row [latent; RoPE key] to the cache and runs paged attention
// over it as MQA with the absorbed queries; these functions make the rows and queries and turn
// the attention's latent mixes into the heads' outputs. See MlaConfig.
#pragma once

#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "model/llama_weights.h"
#include "model/model_config.h"

namespace kvlm {

// Working memory, sized by the largest step so far.
struct MlaScratch {
  std::vector<float> q_lora;  // [n, q_lora]
  std::vector<float> q;       // [n, heads, nope + rope]
  std::vector<float> gather;  // [n, max(nope, kv_lora)] one head's inputs
  std::vector<float> result;  // [n, max(kv_lora, v)] one head's outputs
  std::vector<float> heads;   // [n, heads * v]
};

// rows[t] = [RMSNorm(latent); RoPE key rotated at positions[t]]: [n, kv_lora + rope], the cache's rows.
void mla_cache_rows(const ModelConfig& c, const LlamaLayerWeights& w, const float* xn, int64_t n,
                    const int64_t* positions, ThreadPool& pool, MlaScratch& scratch, float* rows);

// scratch.q = every head's query [n, heads, nope + rope], the RoPE part not yet rotated.
void mla_queries(const ModelConfig& c, const LlamaLayerWeights& w, const float* xn, int64_t n, ThreadPool& pool,
                 MlaScratch& scratch);

// q_abs[t, h] = [W_UK_hᵀ q_nope[t, h]; q_rope[t, h] rotated at positions[t]]: [n, heads, kv_lora + rope],
// which scores a cached row as head h's query scores its expanded key (mla_queries first). When q_sink is given, the
// same with the RoPE part rotated at sink_positions[t] instead (rows whose sink position is -1 are
// left alone).
void mla_absorbed_queries(const ModelConfig& c, const LlamaLayerWeights& w, const float* xn, int64_t n,
                          const int64_t* positions, const int64_t* sink_positions, ThreadPool& pool,
                          MlaScratch& scratch, float* q_abs, float* q_sink);

// out[t] = W_O [W_UV_h mix[t, h] for every head h]: mix is the attention output, [n, heads, kv_lora]
// (a weighted sum of latents); out: [n, dim].
void mla_output(const ModelConfig& c, const LlamaLayerWeights& w, const float* mix, int64_t n, ThreadPool& pool,
                MlaScratch& scratch, float* out);

}  // namespace kvlm
