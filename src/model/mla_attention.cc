#include "model/mla_attention.h"

#include <algorithm>

#include "model/scratch_vector.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"

namespace kvlm {
namespace {

// dst[t, :cols] = src[t * src_stride + offset, :cols] for t < n.
void gather_columns(const float* src, int64_t src_stride, int64_t offset, int64_t cols, int64_t n, float* dst) {
  for (int64_t t = 0; t < n; ++t) std::copy_n(src + t * src_stride + offset, cols, dst + t * cols);
}

void scatter_columns(const float* src, int64_t cols, int64_t n, float* dst, int64_t dst_stride, int64_t offset) {
  for (int64_t t = 0; t < n; ++t) std::copy_n(src + t * cols, cols, dst + t * dst_stride + offset);
}

}  // namespace

void mla_cache_rows(const ModelConfig& c, const LlamaLayerWeights& w, const float* xn, int64_t n,
                    const int64_t* positions, ThreadPool& pool, MlaScratch&, float* rows) {
  const MlaConfig& m = c.mla;
  matmul(w.wkv_a, xn, rows, n, pool);
  pool.parallel_for(n, 8, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* row = rows + t * m.row_dim();
      rms_norm(row, w.kv_a_norm.data(), row, m.kv_lora_rank, c.rms_eps);
      rope_apply(c.rope, row + m.kv_lora_rank, 1, static_cast<Position>(positions[t]));
    }
  });
}

void mla_queries(const ModelConfig& c, const LlamaLayerWeights& w, const float* xn, int64_t n, ThreadPool& pool,
                 MlaScratch& s) {
  const MlaConfig& m = c.mla;
  grow_scratch(s.q, n * c.num_heads * m.qk_head_dim());
  if (m.q_lora_rank > 0) {
    grow_scratch(s.q_lora, n * m.q_lora_rank);
    matmul(w.wq_a, xn, s.q_lora.data(), n, pool);
    for (int64_t t = 0; t < n; ++t) {
      float* r = s.q_lora.data() + t * m.q_lora_rank;
      rms_norm(r, w.q_a_norm.data(), r, m.q_lora_rank, c.rms_eps);
    }
    matmul(w.wq, s.q_lora.data(), s.q.data(), n, pool);
  } else {
    matmul(w.wq, xn, s.q.data(), n, pool);
  }
}

void mla_absorbed_queries(const ModelConfig& c, const LlamaLayerWeights& w, const float* xn, int64_t n,
                          const int64_t* positions, const int64_t* sink_positions, ThreadPool& pool,
                          MlaScratch& s, float* q_abs, float* q_sink) {
  const MlaConfig& m = c.mla;
  const int64_t qk = m.qk_head_dim();
  const int64_t row = m.row_dim();
  const int64_t heads = c.num_heads;
  mla_queries(c, w, xn, n, pool, s);
  // The nope part of each head through W_UK_hᵀ: one matmul per head over all tokens.
  grow_scratch(s.gather, n * m.qk_nope_dim);
  grow_scratch(s.result, n * m.kv_lora_rank);
  for (int64_t h = 0; h < heads; ++h) {
    gather_columns(s.q.data(), heads * qk, h * qk, m.qk_nope_dim, n, s.gather.data());
    matmul(w.uk_t[static_cast<size_t>(h)], s.gather.data(), s.result.data(), n, pool);
    scatter_columns(s.result.data(), m.kv_lora_rank, n, q_abs, heads * row, h * row);
    if (q_sink != nullptr) scatter_columns(s.result.data(), m.kv_lora_rank, n, q_sink, heads * row, h * row);
  }
  // The RoPE part, rotated at the token's position (and, for the sinks, at its position in the cache).
  pool.parallel_for(n, 8, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const float* src = s.q.data() + (t * heads + h) * qk + m.qk_nope_dim;
        float* dst = q_abs + (t * heads + h) * row + m.kv_lora_rank;
        std::copy_n(src, m.qk_rope_dim, dst);
        rope_apply(c.rope, dst, 1, static_cast<Position>(positions[t]));
        if (q_sink != nullptr && sink_positions[t] >= 0) {
          float* sink = q_sink + (t * heads + h) * row + m.kv_lora_rank;
          std::copy_n(src, m.qk_rope_dim, sink);
          rope_apply(c.rope, sink, 1, static_cast<Position>(sink_positions[t]));
        }
      }
    }
  });
}

void mla_output(const ModelConfig& c, const LlamaLayerWeights& w, const float* mix, int64_t n, ThreadPool& pool,
                MlaScratch& s, float* out) {
  const MlaConfig& m = c.mla;
  const int64_t heads = c.num_heads;
  grow_scratch(s.gather, n * m.kv_lora_rank);
  grow_scratch(s.result, n * m.v_head_dim);
  grow_scratch(s.heads, n * heads * m.v_head_dim);
  for (int64_t h = 0; h < heads; ++h) {
    gather_columns(mix, heads * m.kv_lora_rank, h * m.kv_lora_rank, m.kv_lora_rank, n, s.gather.data());
    matmul(w.uv[static_cast<size_t>(h)], s.gather.data(), s.result.data(), n, pool);
    scatter_columns(s.result.data(), m.v_head_dim, n, s.heads.data(), heads * m.v_head_dim, h * m.v_head_dim);
  }
  matmul(w.wo, s.heads.data(), out, n, pool);
}

}  // namespace kvlm
