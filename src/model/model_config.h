// ModelConfig: the shapes and hyper-parameters of a llama-family model, read from GGUF metadata.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "kv/kv_layout.h"
#include "model/rope_scaling.h"
#include "model/sliding_window.h"
#include "ops/elementwise.h"

namespace kvlm {

class GgufFile;

// The FFN's gate nonlinearity: SiLU (llama family) or GELU with the tanh approximation (gemma).
enum class FfnActivation { kSilu, kGeluTanh };

// Multi-head latent attention (deepseek2). Per token and layer the cache holds one row,
// [RMS-normed latent c (kv_lora_rank); the RoPE key shared by all heads (qk_rope_dim)]. Head h's
// key is [W_UK_h c; k_rope], its value W_UV_h c. kvlm computes it absorbed: the query's nope
// part is multiplied by W_UK_hᵀ, so every head scores the cached row itself (MQA over one row),
// and the attention output, a mix of latents, goes through W_UV_h afterwards.
struct MlaConfig {
  int q_lora_rank = 0;   // 0: plain attn_q; else attn_q_a → RMSNorm → attn_q_b
  int kv_lora_rank = 0;  // 0: not MLA
  int qk_nope_dim = 0;   // per-head key dims from the latent
  int qk_rope_dim = 0;   // rotated dims, the shared key's
  int v_head_dim = 0;
  bool split_kv_b = false;  // attn_k_b / attn_v_b (newer converters) rather than attn_kv_b
  // DeepSeek's YaRN: cos and sin stay unscaled and q·k is multiplied by yarn_mscale², where
  // yarn_mscale = attn_factor (1 + yarn_log_multiplier ln factor). 1 without YaRN.
  float yarn_mscale = 1.0f;

  bool enabled() const { return kv_lora_rank > 0; }
  int qk_head_dim() const { return qk_nope_dim + qk_rope_dim; }  // a head's query and key
  int row_dim() const { return kv_lora_rank + qk_rope_dim; }     // the cached row
};

// How a mixture-of-experts router turns its logits into expert probabilities.
enum class ExpertGating { kSoftmax, kSigmoid };
const char* expert_gating_name(ExpertGating gating);

// Mixture-of-experts FFNs (deepseek2): layers from leading_dense_layers on route each token to
// its num_experts_used best experts (weighted by their probabilities, renormalised when
// normalize_weights, times weights_scale) and add the shared experts' FFN.
struct MoeConfig {
  int num_experts = 0;  // 0: every layer is dense
  int num_experts_used = 0;
  int num_shared_experts = 0;
  int expert_ffn_dim = 0;
  int leading_dense_layers = 0;
  ExpertGating gating = ExpertGating::kSoftmax;
  bool normalize_weights = false;
  float weights_scale = 1.0f;
  bool has_expert_bias = false;  // exp_probs_b: added to the probabilities to choose, not to weigh
  // Group-limited routing (DeepSeek-V3): experts in num_groups equal groups; a token chooses among
  // the num_groups_used groups whose two best experts score highest. 1 / 1: no groups.
  int num_groups = 1;
  int num_groups_used = 1;

  bool enabled() const { return num_experts > 0; }
  bool is_moe_layer(int layer) const { return enabled() && layer >= leading_dense_layers; }
};

struct ModelConfig {
  std::string architecture;  // "llama", "mistral", "qwen2", "qwen3", "gemma3", "phi3", "deepseek2"
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
  // deepseek2: num_kv_heads is 1 and head_dim the cached row's width (mla.row_dim()); rope
  // rotates the qk_rope_dim shared dims. attention_scale includes YaRN's mscale².
  MlaConfig mla;
  MoeConfig moe;

  bool is_mla() const { return mla.enabled(); }
  // The cache's shape: [num_kv_heads, head_dim] keys and values, or MLA's one latent row.
  KvLayout kv_layout(int block_size) const;
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
