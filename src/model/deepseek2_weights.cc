#include "model/deepseek2_weights.h"

#include "model/deepseek2_gguf_names.h"
#include "model/llama_gguf_names.h"

namespace kvlm {
namespace {

namespace names = llama_names;
namespace ds = deepseek2_names;

// W_UK_hᵀ for every head from attn_kv_b's key rows (head h: rows [h (nope + v), h (nope + v) + nope)
// of kv_lora values), as f32 [kv_lora, nope] matrices in `derived`.
void transpose_key_up_projection(const ModelConfig& c, const WeightMatrix& kv_b, LlamaLayerWeights& out,
                                 std::vector<std::vector<float>>& derived) {
  const MlaConfig& m = c.mla;
  const int64_t rows_per_head = m.qk_nope_dim + m.v_head_dim;
  std::vector<float> row(static_cast<size_t>(m.kv_lora_rank));
  out.uk_t.resize(static_cast<size_t>(c.num_heads));
  for (int h = 0; h < c.num_heads; ++h) {
    std::vector<float>& t = derived.emplace_back(static_cast<size_t>(m.kv_lora_rank) * m.qk_nope_dim);
    for (int i = 0; i < m.qk_nope_dim; ++i) {
      dequantize_weight_row(kv_b, h * rows_per_head + i, row.data());
      for (int j = 0; j < m.kv_lora_rank; ++j) t[static_cast<size_t>(j) * m.qk_nope_dim + i] = row[static_cast<size_t>(j)];
    }
    out.uk_t[static_cast<size_t>(h)] = WeightMatrix{GgmlType::kF32, reinterpret_cast<const uint8_t*>(t.data()),
                                                    m.kv_lora_rank, m.qk_nope_dim,
                                                    static_cast<uint64_t>(m.qk_nope_dim) * sizeof(float)};
  }
}

void bind_attention(TensorBinder& b, const ModelConfig& c, int l, LlamaLayerWeights& out,
                    std::vector<std::vector<float>>& derived) {
  const MlaConfig& m = c.mla;
  const int64_t q_rows = static_cast<int64_t>(c.num_heads) * m.qk_head_dim();
  if (m.q_lora_rank > 0) {
    out.wq_a = b.matrix(names::blk(l, ds::kAttnQA), m.q_lora_rank, c.dim);
    out.q_a_norm = b.vector(names::blk(l, ds::kAttnQANorm), m.q_lora_rank);
    out.wq = b.matrix(names::blk(l, ds::kAttnQB), q_rows, m.q_lora_rank);
  } else {
    out.wq = b.matrix(names::blk(l, names::kAttnQ), q_rows, c.dim);
  }
  out.wkv_a = b.matrix(names::blk(l, ds::kAttnKvAMqa), m.row_dim(), c.dim);
  out.kv_a_norm = b.vector(names::blk(l, ds::kAttnKvANorm), m.kv_lora_rank);
  out.wo = b.matrix(names::blk(l, names::kAttnOutput), c.dim, static_cast<int64_t>(c.num_heads) * m.v_head_dim);
  if (m.split_kv_b) {
    out.uk_t = b.slabs(names::blk(l, ds::kAttnKB), c.num_heads, m.kv_lora_rank, m.qk_nope_dim);
    out.uv = b.slabs(names::blk(l, ds::kAttnVB), c.num_heads, m.v_head_dim, m.kv_lora_rank);
    if (out.uk_t[0].data != nullptr) {
      out.k_b = out.uk_t[0];
      out.k_b.rows = static_cast<int64_t>(c.num_heads) * m.kv_lora_rank;
    }
    if (out.uv[0].data != nullptr) {
      out.v_b = out.uv[0];
      out.v_b.rows = static_cast<int64_t>(c.num_heads) * m.v_head_dim;
    }
    return;
  }
  const int64_t rows_per_head = m.qk_nope_dim + m.v_head_dim;
  out.kv_b = b.matrix(names::blk(l, ds::kAttnKvB), c.num_heads * rows_per_head, m.kv_lora_rank);
  if (out.kv_b.data == nullptr) return;
  out.uv.resize(static_cast<size_t>(c.num_heads));
  for (int h = 0; h < c.num_heads; ++h) {
    out.uv[static_cast<size_t>(h)] = WeightMatrix{out.kv_b.type, out.kv_b.data + (h * rows_per_head + m.qk_nope_dim) * out.kv_b.row_bytes,
                                                  m.v_head_dim, m.kv_lora_rank, out.kv_b.row_bytes};
  }
  transpose_key_up_projection(c, out.kv_b, out, derived);
}

void bind_ffn(TensorBinder& b, const ModelConfig& c, int l, LlamaLayerWeights& out) {
  const MoeConfig& e = c.moe;
  if (!e.is_moe_layer(l)) {
    out.w_gate = b.matrix(names::blk(l, names::kFfnGate), c.ffn_dim, c.dim);
    out.w_up = b.matrix(names::blk(l, names::kFfnUp), c.ffn_dim, c.dim);
    out.w_down = b.matrix(names::blk(l, names::kFfnDown), c.dim, c.ffn_dim);
    return;
  }
  out.router = b.matrix(names::blk(l, ds::kFfnGateInp), e.num_experts, c.dim);
  if (e.has_expert_bias) out.expert_bias = b.vector(names::blk(l, ds::kExpProbsBias), e.num_experts);
  out.exp_gate = b.slabs(names::blk(l, ds::kFfnGateExps), e.num_experts, e.expert_ffn_dim, c.dim);
  out.exp_up = b.slabs(names::blk(l, ds::kFfnUpExps), e.num_experts, e.expert_ffn_dim, c.dim);
  out.exp_down = b.slabs(names::blk(l, ds::kFfnDownExps), e.num_experts, c.dim, e.expert_ffn_dim);
  if (e.num_shared_experts > 0) {
    const int64_t shared_ffn = static_cast<int64_t>(e.expert_ffn_dim) * e.num_shared_experts;
    out.shared_gate = b.matrix(names::blk(l, ds::kFfnGateShexp), shared_ffn, c.dim);
    out.shared_up = b.matrix(names::blk(l, ds::kFfnUpShexp), shared_ffn, c.dim);
    out.shared_down = b.matrix(names::blk(l, ds::kFfnDownShexp), c.dim, shared_ffn);
  }
}

}  // namespace

void bind_deepseek2_layer(TensorBinder& b, const ModelConfig& c, int l, LlamaLayerWeights& out,
                          std::vector<std::vector<float>>& derived) {
  out.attn_norm = b.vector(names::blk(l, names::kAttnNorm), c.dim);
  out.ffn_norm = b.vector(names::blk(l, names::kFfnNorm), c.dim);
  bind_attention(b, c, l, out, derived);
  bind_ffn(b, c, l, out);
}

}  // namespace kvlm
