// LlamaWeights: zero-copy views of a llama-family model's tensors inside a mapped GGUF file.
#pragma once

#include <vector>

#include "core/status.h"
#include "model/model_config.h"
#include "ops/matmul.h"

namespace kvlm {

class GgufFile;

struct LlamaLayerWeights {
  std::vector<float> attn_norm;  // [dim]
  WeightMatrix wq;               // [q_dim, dim]
  WeightMatrix wk;               // [kv_dim, dim]
  WeightMatrix wv;               // [kv_dim, dim]
  WeightMatrix wo;               // [dim, q_dim]
  std::vector<float> bq;         // [q_dim]   qwen2 only, else empty
  std::vector<float> bk;         // [kv_dim]
  std::vector<float> bv;         // [kv_dim]
  std::vector<float> q_norm;     // [head_dim] qwen3, gemma3: RMSNorm of each query head, else empty
  std::vector<float> k_norm;     // [head_dim] the same for each key head
  std::vector<float> post_attn_norm;  // [dim] gemma3: RMSNorm of the attention output, else empty
  std::vector<float> ffn_norm;   // [dim]
  std::vector<float> post_ffn_norm;   // [dim] gemma3: RMSNorm of the FFN output, else empty
  WeightMatrix w_gate;           // [ffn_dim, dim]   (dense layers)
  WeightMatrix w_up;             // [ffn_dim, dim]
  WeightMatrix w_down;           // [dim, ffn_dim]

  // deepseek2, MLA (model/deepseek2_weights.h). wq is attn_q, or attn_q_b after wq_a and q_a_norm:
  // [heads * (nope + rope), dim or q_lora]. wo: [dim, heads * v_head].
  WeightMatrix wq_a;                 // [q_lora, dim], empty without q_lora
  std::vector<float> q_a_norm;       // [q_lora]
  WeightMatrix wkv_a;                // [kv_lora + rope, dim]: the latent, then the shared RoPE key
  std::vector<float> kv_a_norm;      // [kv_lora]
  // The up-projections as the file holds them, for the reference: attn_kv_b [heads * (nope + v),
  // kv_lora], or attn_k_b [heads * kv_lora, nope] (head h: W_UK_hᵀ) and attn_v_b [heads * v, kv_lora].
  WeightMatrix kv_b;
  WeightMatrix k_b;
  WeightMatrix v_b;
  // Per head, as the absorbed forward multiplies them: W_UK_hᵀ [kv_lora, nope] (views of attn_k_b,
  // or an f32 transpose of attn_kv_b's rows held in LlamaWeights::derived) and W_UV_h [v, kv_lora].
  std::vector<WeightMatrix> uk_t;
  std::vector<WeightMatrix> uv;

  // deepseek2, MoE layers: the router, its selection bias, the routed experts and the shared ones.
  WeightMatrix router;               // [experts, dim] ffn_gate_inp
  std::vector<float> expert_bias;    // [experts] exp_probs_b, or empty
  std::vector<WeightMatrix> exp_gate;  // [experts] each [expert_ffn, dim]
  std::vector<WeightMatrix> exp_up;    // [experts] each [expert_ffn, dim]
  std::vector<WeightMatrix> exp_down;  // [experts] each [dim, expert_ffn]
  WeightMatrix shared_gate;          // [expert_ffn * shared, dim], empty without shared experts
  WeightMatrix shared_up;
  WeightMatrix shared_down;          // [dim, expert_ffn * shared]
};

struct LlamaWeights {
  WeightMatrix token_embd;       // [vocab, dim]
  std::vector<float> output_norm;// [dim]
  WeightMatrix output;           // [vocab, dim]; equals token_embd when tied
  std::vector<LlamaLayerWeights> layers;
  // Matrices kvlm derived at load (f32), which views above point into: MLA's W_UK_hᵀ when the
  // file has only attn_kv_b.
  std::vector<std::vector<float>> derived;
  int experts_used_per_token = 0;  // MoE: routed experts a token runs

  // Binds every tensor, checking shapes and types. All missing tensors are listed in one error.
  // The views point into `file`, which must outlive the weights.
  static Result<LlamaWeights> bind(const GgufFile& file, const ModelConfig& config);

  // Bytes of weights one decode step streams (every matrix once, the embedding row aside; of a
  // MoE layer's routed experts, the used ones' share).
  uint64_t decode_weight_bytes() const;
  // Bytes of weights kvlm holds in its own memory instead of using the file's in place: the f32
  // norms and biases, and the derived matrices. Every matrix of the file is a view.
  uint64_t copied_bytes() const;
};

}  // namespace kvlm
