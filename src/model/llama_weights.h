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
  WeightMatrix w_gate;           // [ffn_dim, dim]
  WeightMatrix w_up;             // [ffn_dim, dim]
  WeightMatrix w_down;           // [dim, ffn_dim]
};

struct LlamaWeights {
  WeightMatrix token_embd;       // [vocab, dim]
  std::vector<float> output_norm;// [dim]
  WeightMatrix output;           // [vocab, dim]; equals token_embd when tied
  std::vector<LlamaLayerWeights> layers;

  // Binds every tensor, checking shapes and types. All missing tensors are listed in one error.
  // The views point into `file`, which must outlive the weights.
  static Result<LlamaWeights> bind(const GgufFile& file, const ModelConfig& config);

  // Bytes of weights one decode step streams (every matrix once, the embedding row aside).
  uint64_t decode_weight_bytes() const;
};

}  // namespace kvlm
