// synthesize_model: deterministic random GGUF models of any shape (`kvlm synth`): the llama family, and
// DeepSeek-V2's multi-head latent attention with mixture-of-experts FFNs (architecture "deepseek2").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace kvlm {

// How the synthesized model's RoPE is scaled, written as real converters write it.
struct SynthRopeScaling {
  std::string type = "none";   // "none", "linear", "yarn" (metadata), "llama3" (the rope_freqs
                               // tensor), "llama3-metadata" (the rope_scaling keys, no tensor)
  float factor = 1.0f;
  int original_context = 0;    // yarn and llama3
  float low_freq_factor = 1.0f;   // llama3
  float high_freq_factor = 4.0f;
  // deepseek2 yarn: rope.scaling.yarn_log_multiplier, 0.1 * HF's mscale_all_dim (0: the key left out).
  // Last, so the positional initializers of the fields above stay valid.
  float yarn_log_multiplier = 0.0f;
};

// How a deepseek2 file holds the MLA up-projection of the latent to keys and values.
enum class SynthMlaLayout {
  kKvB,    // attn_kv_b {kv_lora, heads*(nope+v)}, per-head key/value lengths (older converters)
  kSplit,  // attn_k_b {nope, kv_lora, heads} + attn_v_b {kv_lora, v, heads}, the MQA view (newer converters)
};

// How a deepseek2 router turns its logits into expert weights (expert_gating_func).
enum class SynthExpertGating {
  kSoftmax = 1,  // DeepSeek-V2
  kSigmoid = 2,  // DeepSeek-V3: optionally with a per-expert selection bias (exp_probs_b)
};

struct SynthShape {
  std::string architecture = "llama";  // "llama", "qwen2" (NeoX RoPE, q/k/v biases), "qwen3" (q/k norms),
                                       // "gemma3" (q/k norms, post-norms, GELU, sliding-window layers),
                                       // "phi3" (fused q/k/v and gate/up) or "deepseek2" (MLA + MoE, below)
  int num_layers = 0;
  int dim = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;                    // may differ from dim / num_heads (written as key/value_length)
  int ffn_dim = 0;                     // deepseek2: the dense layers' FFN
  int vocab_size = 0;
  int context_length = 0;
  float rope_freq_base = 10000.0f;
  float rms_eps = 1e-5f;
  bool tied_output = true;             // no output.weight: the classifier is token_embd
  bool qkv_bias = false;               // attn_{q,k,v}.bias tensors, as qwen2 has
  SynthRopeScaling rope_scaling;
  // gemma3: attention.sliding_window (required), and the local layers' period written as
  // attention.sliding_window_pattern (0: the key is left out, so readers apply Gemma 3's
  // default of 6); rope.freq_base_swa for the local layers.
  int sliding_window = 0;
  int sliding_window_period = 0;
  float rope_freq_base_swa = 10000.0f;

  // deepseek2 only (every field 0 / its default elsewhere). Multi-head latent attention: queries
  // through a rank-q_lora_rank bottleneck (0: one attn_q matrix); keys and values from one
  // kv_lora_rank latent per token plus a shared qk_rope_dim RoPE key. For deepseek2 num_kv_heads
  // must equal num_heads and head_dim must be qk_nope_dim + qk_rope_dim (a query head's length).
  int q_lora_rank = 0;
  int kv_lora_rank = 0;
  int qk_nope_dim = 0;   // per head, without RoPE
  int qk_rope_dim = 0;   // per head, with RoPE (rope.dimension_count); even
  int v_head_dim = 0;
  SynthMlaLayout mla_layout = SynthMlaLayout::kKvB;
  // Layers [0, leading_dense_layers) have a dense FFN of ffn_dim; the rest route each token to
  // num_experts_used of num_experts experts of expert_ffn_dim, plus num_shared_experts always on.
  // num_experts = 0: every layer dense (leading_dense_layers = num_layers, the other MoE fields 0).
  int leading_dense_layers = 0;
  int num_experts = 0;
  int num_experts_used = 0;
  int num_shared_experts = 0;
  int expert_ffn_dim = 0;
  SynthExpertGating expert_gating = SynthExpertGating::kSoftmax;
  bool expert_weights_norm = false;    // the chosen experts' weights renormalized to sum 1
  float expert_weights_scale = 1.0f;   // routed experts' output multiplied by it
  bool expert_bias = false;            // exp_probs_b.bias: sigmoid gating's selection bias

  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }
  // Parameters in all tensors (biases and norms included).
  int64_t num_parameters() const;
  // Checks every field; errors name the field.
  Status validate() const;
};

struct SynthOptions {
  SynthShape shape;
  GgmlType weight_type = GgmlType::kF32;  // matrices: any type kvlm can quantize; norms and biases stay f32
  uint64_t seed = 1;
  std::string name;                       // general.name; empty: "synthetic"
  std::string out_path;
  int num_threads = 0;                    // 0: all hardware threads. The output never depends on it.
};

// DeepSeek-V2-Lite's layer count. llama.cpp reads a deepseek2 file without attention.q_lora_rank only
// at 27 or 26 layers, and one with it only at any other count (it recognizes V2-Lite and GigaChat3,
// the models without a q bottleneck, by their layer counts).
inline constexpr int kDeepseek2LiteLayers = 27;
// Why llama.cpp would refuse a valid file of this shape (for a warning at the edge), or nullopt:
// deepseek2 with q_lora_rank 0 at other than 26/27 layers or > 0 at 26/27, or MoE layers without
// shared experts.
std::optional<std::string> synth_llama_cpp_incompatibility(const SynthShape& shape);

// Shapes of well-known models and tiny test models; an unknown name is an error listing them.
Result<SynthShape> synth_preset(std::string_view name);
std::vector<std::string> synth_preset_names();

// Writes a model whose weights come from a counter-based generator seeded per (seed, tensor, row),
// so the bytes depend only on the options. Scales keep activations finite and logits spread:
//   token_embd, output     uniform, std 2/sqrt(dim)  (logits have std ~2 after the final norm)
//   attn_q/k/v, ffn_gate/up uniform, std 1/sqrt(fan_in)
//   attn_output, ffn_down   uniform, std 1/sqrt(fan_in * 2 * num_layers)  (residual stream stays ~1)
//   norms                   1 + uniform noise of std 0.02;  biases  uniform, std 0.1
//   qwen3's and gemma3's q/k norms, gemma3's post-norms   as norms
// deepseek2 (dims as GGUF writes them, inputs first; see model_synthesizer_deepseek2.h for the keys):
//   attn_q {dim, heads*(nope+rope)}, or attn_q_a {dim, q_lora} + attn_q_a_norm + attn_q_b {q_lora, heads*(nope+rope)};
//   attn_kv_a_mqa {dim, kv_lora+rope}, attn_kv_a_norm {kv_lora}; attn_kv_b {kv_lora, heads*(nope+v)} (per head:
//   nope key rows, then v value rows), or its split attn_k_b {nope, kv_lora, heads} (W_UK_h transposed) +
//   attn_v_b {kv_lora, v, heads}, drawn from attn_kv_b's stream so both layouts hold the same model;
//   attn_output {heads*v, dim}. Dense layers: ffn_gate/up/down. MoE layers: ffn_gate_inp {dim, experts}
//   (the router: F32, std 3/sqrt(dim): logits of std ~3, so top-k ties are rare, though Q8_0's changes to the
//   activations still flip a few tokens' choices), ffn_{gate,up}_exps {dim, expert_ffn, experts},
//   ffn_down_exps {expert_ffn, dim, experts} (expert e: the e-th slab of rows), ffn_{gate,up,down}_shexp of
//   width expert_ffn * shared; exp_probs_b.bias {experts} (F32, std 0.1). Inputs after a norm get
//   std 1/sqrt(fan_in) as above, every residual-branch output 1/sqrt(fan_in * 2 * num_layers).
// Matrices (3-D expert and head stacks row by row) take the weight type; a matrix whose row length
// is not a multiple of the type's block, the norms, the biases, ffn_gate_inp and exp_probs_b stay F32.
// Tensors are generated row by row at write time, in parallel, so large models never sit in memory.
Status synthesize_model(const SynthOptions& options);

}  // namespace kvlm
