// synthesize_model: deterministic random llama-family GGUF models of any shape (`kvlm synth`).
#pragma once

#include <cstdint>
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
};

struct SynthShape {
  std::string architecture = "llama";  // "llama", "qwen2" (NeoX RoPE, q/k/v biases), "qwen3" (q/k norms) or
                                       // "gemma3" (q/k norms, post-norms, GELU, sliding-window layers)
  int num_layers = 0;
  int dim = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;                    // may differ from dim / num_heads (written as key/value_length)
  int ffn_dim = 0;
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
// Tensors are generated row by row at write time, in parallel, so large models never sit in memory.
Status synthesize_model(const SynthOptions& options);

}  // namespace kvlm
