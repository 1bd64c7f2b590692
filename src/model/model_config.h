// ModelConfig: the shapes and hyper-parameters of a llama-family model, read from GGUF metadata.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "model/rope_scaling.h"
#include "model/sliding_window.h"
#include "ops/elementwise.h"

namespace kvlm {

class GgufFile;

// The FFN's gate nonlinearity: SiLU (llama family) or GELU with the tanh approximation (gemma).
enum class FfnActivation { kSilu, kGeluTanh };

struct ModelConfig {
  std::string architecture;  // "llama", "mistral", "qwen2", "qwen3", "gemma3", "phi3"
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
  bool fused_qkv = false;     // phi3: attn_qkv holds q, k and v rows (read as three views)
  bool fused_gate_up = false; // phi3: ffn_up holds the gate rows, then the up rows
  bool has_qk_norm = false;  // qwen3: per-head RMSNorm of q and k before RoPE
  bool tied_output = false;  // output projection shares token_embd
  // What the file states that kvlm reads differently, for the user (printed at load by the CLI).
  std::vector<std::string> warnings;
  // gemma3: the embedding row is scaled by sqrt(dim), attention and FFN outputs are RMS-normed
  // (post_attention_norm, post_ffw_norm) before the residual add, and the FFN gate is GELU.
  float embedding_scale = 1.0f;
  bool has_post_norms = false;
  FfnActivation ffn_activation = FfnActivation::kSilu;
  float attention_scale = 0.0f;  // q·k multiplier: 1/sqrt(head_dim), gemma3 1/sqrt(query_pre_attn_scalar)
  // Local (sliding-window) layers and their own RoPE (gemma3: rope.freq_base_swa, unscaled).
  SlidingWindowConfig sliding_window;
  RopeParams local_rope;

  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }
  int group_size() const { return num_heads / num_kv_heads; }
  bool is_local_layer(int layer) const { return sliding_window.is_local(layer); }
  // The RoPE a layer rotates with: local layers of gemma3 have their own base, unscaled.
  const RopeParams& layer_rope(int layer) const { return is_local_layer(layer) ? local_rope : rope; }
  // "MHA", "GQA" or "MQA" from the head counts.
  std::string attention_kind() const;

  // Reads and validates the metadata; tied_output is decided from the tensors present.
  static Result<ModelConfig> from_gguf(const GgufFile& file);
};

}  // namespace kvlm
