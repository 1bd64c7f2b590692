// ModelConfig: the shapes and hyper-parameters of a llama-family model, read from GGUF metadata.
#pragma once

#include <string>

#include "core/status.h"
#include "model/rope_scaling.h"
#include "ops/elementwise.h"

namespace kvlm {

class GgufFile;

struct ModelConfig {
  std::string architecture;  // "llama", "mistral", "qwen2", "qwen3"
  std::string name;          // general.name, may be empty
  int num_layers = 0;
  int dim = 0;               // residual stream width
  int num_heads = 0;         // query heads
  int num_kv_heads = 0;      // MHA: == num_heads; GQA: divides it; MQA: 1
  int head_dim = 0;
  int ffn_dim = 0;
  int vocab_size = 0;
  int context_length = 0;    // trained context the file states
  float rms_eps = 1e-5f;
  RopeParams rope;
  RopeScalingKind rope_scaling = RopeScalingKind::kNone;  // how `rope` was scaled, for inspect
  float rope_scaling_factor = 1.0f;
  bool has_qkv_bias = false; // qwen2
  bool has_qk_norm = false;  // qwen3: per-head RMSNorm of q and k before RoPE
  bool tied_output = false;  // output projection shares token_embd

  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }
  int group_size() const { return num_heads / num_kv_heads; }
  // "MHA", "GQA" or "MQA" from the head counts.
  std::string attention_kind() const;

  // Reads and validates the metadata; tied_output is decided from the tensors present.
  static Result<ModelConfig> from_gguf(const GgufFile& file);
};

}  // namespace kvlm
