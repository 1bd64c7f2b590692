#include "model/mla_expanded.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "kv/kv_storage.h"
#include "model/scratch_vector.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"

namespace kvlm {
namespace {

// attn_kv_b of a layer, as a matrix: the file's, or one stacked in f32 from attn_k_b / attn_v_b.
WeightMatrix up_projection(const ModelConfig& c, const LlamaLayerWeights& w, int layer, MlaExpandedScratch& s) {
  if (w.kv_b.data != nullptr) return w.kv_b;
  const MlaConfig& m = c.mla;
  const int64_t per_head = m.qk_nope_dim + m.v_head_dim;
  if (s.kv_b.size() <= static_cast<size_t>(layer)) s.kv_b.resize(static_cast<size_t>(layer) + 1);
  std::vector<float>& kv_b = s.kv_b[static_cast<size_t>(layer)];
  if (kv_b.empty()) {
    kv_b.resize(static_cast<size_t>(c.num_heads * per_head * m.kv_lora_rank));
    std::vector<float> row(static_cast<size_t>(std::max(m.qk_nope_dim, m.kv_lora_rank)));
    for (int h = 0; h < c.num_heads; ++h) {
      float* head = kv_b.data() + static_cast<size_t>(h * per_head * m.kv_lora_rank);
      for (int j = 0; j < m.kv_lora_rank; ++j) {  // W_UK_hᵀ row j is column j of W_UK_h
        dequantize_weight_row(w.uk_t[static_cast<size_t>(h)], j, row.data());
        for (int i = 0; i < m.qk_nope_dim; ++i) head[static_cast<size_t>(i) * m.kv_lora_rank + j] = row[static_cast<size_t>(i)];
      }
      for (int i = 0; i < m.v_head_dim; ++i) {
        dequantize_weight_row(w.uv[static_cast<size_t>(h)], i, head + static_cast<size_t>(m.qk_nope_dim + i) * m.kv_lora_rank);
      }
    }
  }
  return WeightMatrix{GgmlType::kF32, reinterpret_cast<const uint8_t*>(kv_b.data()), c.num_heads * per_head,
                      m.kv_lora_rank, static_cast<uint64_t>(m.kv_lora_rank) * sizeof(float)};
}

}  // namespace

const char* mla_mode_name(MlaMode mode) { return mode == MlaMode::kExpanded ? "expanded" : "absorbed"; }

void mla_expanded_attention(const ModelConfig& c, const LlamaLayerWeights& w, const KvStorage& cache, int layer,
                            std::span<const int32_t> block_table, int num_context, int num_queries, const float* q,
                            const int64_t* positions, ThreadPool& pool, MlaExpandedScratch& s, float* heads_out) {
  const MlaConfig& m = c.mla;
  const int64_t ctx = num_context, heads = c.num_heads, nope = m.qk_nope_dim, rope = m.qk_rope_dim;
  const int64_t vd = m.v_head_dim, r = m.kv_lora_rank, qk = nope + rope, per_head = nope + vd;
  const int bs = cache.layout().block_size;
  KVLM_CHECK(num_queries >= 1 && num_queries <= num_context, "{} queries over {} tokens", num_queries, num_context);
  grow_scratch(s.latents, ctx * r);
  grow_scratch(s.k_rope, ctx * rope);
  grow_scratch(s.kv, ctx * heads * per_head);
  grow_scratch(s.row, r + rope);
  // The rows as the cache decodes them (any codec), split into latents and RoPE keys.
  for (int64_t t = 0; t < ctx; ++t) {
    cache.read_token(layer, BlockId{block_table[static_cast<size_t>(t / bs)]}, static_cast<int>(t % bs), s.row.data(),
                     nullptr);
    std::copy_n(s.row.data(), r, s.latents.data() + t * r);
    std::copy_n(s.row.data() + r, rope, s.k_rope.data() + t * rope);
  }
  matmul(up_projection(c, w, layer, s), s.latents.data(), s.kv.data(), ctx, pool);

  const float scale = c.attention_scale;
  const int64_t first_query = ctx - num_queries;
  pool.parallel_for(num_queries * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(static_cast<size_t>(ctx));
    std::vector<float> q_rope(static_cast<size_t>(rope));
    for (int64_t job = begin; job < end; ++job) {
      const int64_t i = job / heads, h = job % heads;
      const float* qh = q + (i * heads + h) * qk;
      std::copy_n(qh + nope, rope, q_rope.data());
      rope_apply(c.rope, q_rope.data(), 1, static_cast<Position>(positions[i]));
      const int64_t visible = first_query + i + 1;
      float max_score = -INFINITY;
      for (int64_t t = 0; t < visible; ++t) {
        const float* k = s.kv.data() + (t * heads + h) * per_head;
        const float* kr = s.k_rope.data() + t * rope;
        float dot = 0.0f;
        for (int64_t d = 0; d < nope; ++d) dot += qh[d] * k[d];
        for (int64_t d = 0; d < rope; ++d) dot += q_rope[static_cast<size_t>(d)] * kr[d];
        scores[static_cast<size_t>(t)] = dot * scale;
        max_score = std::max(max_score, scores[static_cast<size_t>(t)]);
      }
      float sum = 0.0f;
      for (int64_t t = 0; t < visible; ++t) sum += (scores[static_cast<size_t>(t)] = std::exp(scores[static_cast<size_t>(t)] - max_score));
      float* out = heads_out + (i * heads + h) * vd;
      std::fill_n(out, vd, 0.0f);
      for (int64_t t = 0; t < visible; ++t) {
        const float p = scores[static_cast<size_t>(t)] / sum;
        const float* v = s.kv.data() + (t * heads + h) * per_head + nope;
        for (int64_t d = 0; d < vd; ++d) out[d] += p * v[d];
      }
    }
  });
}

}  // namespace kvlm
