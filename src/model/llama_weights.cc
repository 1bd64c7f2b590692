#include "model/llama_weights.h"

#include "model/deepseek2_weights.h"
#include "model/llama_gguf_names.h"
#include "model/tensor_binder.h"

namespace kvlm {
namespace {

namespace names = llama_names;

uint64_t matrix_bytes(const WeightMatrix& w) { return static_cast<uint64_t>(w.rows) * w.row_bytes; }

uint64_t matrices_bytes(const std::vector<WeightMatrix>& ws) {
  uint64_t total = 0;
  for (const WeightMatrix& w : ws) total += matrix_bytes(w);
  return total;
}

}  // namespace

Result<LlamaWeights> LlamaWeights::bind(const GgufFile& file, const ModelConfig& c) {
  TensorBinder b(file);
  LlamaWeights w;
  w.token_embd = b.matrix(names::kTokenEmbd, c.vocab_size, c.dim);
  w.output_norm = b.vector(names::kOutputNorm, c.dim);
  w.output = c.tied_output ? w.token_embd : b.matrix(names::kOutput, c.vocab_size, c.dim);
  w.layers.resize(static_cast<size_t>(c.num_layers));
  w.experts_used_per_token = c.moe.num_experts_used;
  for (int l = 0; l < c.num_layers; ++l) {
    LlamaLayerWeights& layer = w.layers[static_cast<size_t>(l)];
    if (c.is_mla()) {
      bind_deepseek2_layer(b, c, l, layer, w.derived);
      continue;
    }
    layer.attn_norm = b.vector(names::blk(l, names::kAttnNorm), c.dim);
    if (c.fused_qkv) {
      const std::vector<WeightMatrix> qkv =
          b.split_rows(names::blk(l, names::kAttnQkv), {c.q_dim(), c.kv_dim(), c.kv_dim()}, c.dim);
      layer.wq = qkv[0];
      layer.wk = qkv[1];
      layer.wv = qkv[2];
    } else {
      layer.wq = b.matrix(names::blk(l, names::kAttnQ), c.q_dim(), c.dim);
      layer.wk = b.matrix(names::blk(l, names::kAttnK), c.kv_dim(), c.dim);
      layer.wv = b.matrix(names::blk(l, names::kAttnV), c.kv_dim(), c.dim);
    }
    layer.wo = b.matrix(names::blk(l, names::kAttnOutput), c.dim, c.q_dim());
    if (c.has_qkv_bias) {
      layer.bq = b.vector(names::blk(l, names::kAttnQBias), c.q_dim());
      layer.bk = b.vector(names::blk(l, names::kAttnKBias), c.kv_dim());
      layer.bv = b.vector(names::blk(l, names::kAttnVBias), c.kv_dim());
    }
    if (c.has_qk_norm) {
      layer.q_norm = b.vector(names::blk(l, names::kAttnQNorm), c.head_dim);
      layer.k_norm = b.vector(names::blk(l, names::kAttnKNorm), c.head_dim);
    }
    layer.ffn_norm = b.vector(names::blk(l, names::kFfnNorm), c.dim);
    if (c.has_post_norms) {
      layer.post_attn_norm = b.vector(names::blk(l, names::kAttnPostNorm), c.dim);
      layer.post_ffn_norm = b.vector(names::blk(l, names::kFfnPostNorm), c.dim);
    }
    if (c.fused_gate_up) {
      const std::vector<WeightMatrix> gate_up = b.split_rows(names::blk(l, names::kFfnUp), {c.ffn_dim, c.ffn_dim}, c.dim);
      layer.w_gate = gate_up[0];
      layer.w_up = gate_up[1];
    } else {
      layer.w_gate = b.matrix(names::blk(l, names::kFfnGate), c.ffn_dim, c.dim);
      layer.w_up = b.matrix(names::blk(l, names::kFfnUp), c.ffn_dim, c.dim);
    }
    layer.w_down = b.matrix(names::blk(l, names::kFfnDown), c.dim, c.ffn_dim);
  }
  KVLM_RETURN_IF_ERROR(b.status());
  return w;
}

uint64_t LlamaWeights::decode_weight_bytes() const {
  uint64_t total = matrix_bytes(output);
  for (const LlamaLayerWeights& l : layers) {
    total += matrix_bytes(l.wq) + matrix_bytes(l.wk) + matrix_bytes(l.wv) + matrix_bytes(l.wo) +
             matrix_bytes(l.w_gate) + matrix_bytes(l.w_up) + matrix_bytes(l.w_down);
    total += matrix_bytes(l.wq_a) + matrix_bytes(l.wkv_a) + matrices_bytes(l.uk_t) + matrices_bytes(l.uv);
    total += matrix_bytes(l.router) + matrix_bytes(l.shared_gate) + matrix_bytes(l.shared_up) +
             matrix_bytes(l.shared_down);
    if (!l.exp_gate.empty()) {
      const uint64_t experts = matrices_bytes(l.exp_gate) + matrices_bytes(l.exp_up) + matrices_bytes(l.exp_down);
      total += experts / l.exp_gate.size() * static_cast<uint64_t>(experts_used_per_token);
    }
  }
  return total;
}

uint64_t LlamaWeights::copied_bytes() const {
  uint64_t floats = output_norm.size();
  for (const std::vector<float>& d : derived) floats += d.size();
  for (const LlamaLayerWeights& l : layers) {
    for (const std::vector<float>* v : {&l.attn_norm, &l.bq, &l.bk, &l.bv, &l.q_norm, &l.k_norm, &l.post_attn_norm,
                                        &l.ffn_norm, &l.post_ffn_norm, &l.q_a_norm, &l.kv_a_norm, &l.expert_bias}) {
      floats += v->size();
    }
  }
  return floats * sizeof(float);
}

}  // namespace kvlm
