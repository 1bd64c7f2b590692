// ModelShape: the attention shapes and weight size the KV planner needs (presets, GGUF, flags).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "gguf/gguf_file.h"
#include "model/model_config.h"

namespace kvlm {

// Only what decides KV memory and weight memory. Deliberately not ModelConfig: the
// planner must also describe models kvlm cannot load (70B presets, shapes given by flags).
struct ModelShape {
  std::string name;          // preset name, file name or "custom"
  std::string architecture;  // "llama", "deepseek2", ...
  int num_layers = 0;
  int num_heads = 0;         // query heads: the MHA baseline stores K and V for each
  int num_kv_heads = 0;      // K/V heads actually stored (GQA when < num_heads)
  int head_dim = 0;          // K head size (for MLA: qk_nope + qk_rope)
  int v_head_dim = 0;        // V head size
  int64_t context_length = 0;
  double num_params = 0;     // 0 when unknown
  uint64_t weight_bytes = 0; // bytes of the weights as stored; 0 when unknown (presets)
  // MLA (multi-head latent attention): 0 when the model is not MLA. The cache then holds
  // one latent of kv_lora_rank + rope_head_dim values per layer and token, shared by all heads.
  int kv_lora_rank = 0;
  int rope_head_dim = 0;
  // Local (sliding-window) layers: each keeps only the last `window` tokens, so its cache stops
  // growing there; the other layers are global. No window: every layer is global.
  SlidingWindowConfig sliding_window;
  // What reading the shape could not apply, for the CLI to print (a GGUF file whose sliding
  // window kvlm refuses is planned as a full cache, with the reason here).
  std::vector<std::string> warnings;

  bool is_mla() const { return kv_lora_rank > 0; }
  // Values one token stores per layer in the MLA latent (kv_lora_rank + rope_head_dim).
  int latent_dim() const { return kv_lora_rank + rope_head_dim; }
  int num_local_layers() const { return sliding_window.num_local_layers(); }
  int num_global_layers() const { return num_layers - num_local_layers(); }
  bool has_local_layers() const { return num_local_layers() > 0; }
  // Tokens a local layer keeps of a sequence of `tokens`: min(tokens, window).
  int64_t local_layer_tokens(int64_t tokens) const {
    return tokens < sliding_window.window ? tokens : sliding_window.window;
  }
  // Σ over layers of the tokens each keeps for a sequence of `tokens`: global layers all of
  // them, local layers min(tokens, window). Bytes are this × the bytes of one token in one layer.
  int64_t layer_tokens(int64_t tokens) const {
    return num_global_layers() * tokens + num_local_layers() * local_layer_tokens(tokens);
  }
  // The share of the full cache a sequence of `tokens` keeps: layer_tokens / (layers × tokens);
  // exactly 1 without local layers.
  double kept_fraction(int64_t tokens) const {
    return tokens <= 0 ? 1.0 : static_cast<double>(layer_tokens(tokens)) / (static_cast<double>(num_layers) * tokens);
  }
};

// Every count positive and within sane bounds (the planner's products must not overflow),
// kv heads dividing heads, a sliding window in [1, 2^31] with one 0/1 entry per layer and at
// least one local layer (or no window and no entries); the message names the field and the value.
Status validate_model_shape(const ModelShape& shape);

// "5, 11, 17, 23": the global layers of a shape with local layers, the first 16 and a count of
// the rest when there are more; "none" when every layer is local.
std::string global_layer_list(const ModelShape& shape);
// "local layers: 22 of 26 at window 512: 83% of the full cache saved at 32,768 tokens" (the
// saving is 1 − kept_fraction(tokens)); empty without local layers.
std::string local_layer_saving(const ModelShape& shape, int64_t tokens);

// The built-in presets: llama-2-7b, llama-3-8b, llama-3.2-1b, deepseek-v2-lite, deepseek-v2,
// gemma-3-1b, gemma-3-4b, gemma-3-12b, gemma-3-27b (local layers: every layer but 5, 11, ...).
std::span<const ModelShape> model_presets();
// The preset called `name` (case-insensitive); an error listing the presets otherwise.
Result<ModelShape> find_preset(std::string_view name);
// "llama-2-7b, llama-3-8b, ...": for errors and --help.
std::string preset_list();

// Reads the shape from GGUF metadata (<arch>.block_count, .attention.head_count[_kv],
// .attention.key_length/.value_length, .context_length; deepseek2 also
// .attention.kv_lora_rank and .rope.dimension_count; local layers through read_sliding_window,
// whose error, when the file states a window kvlm refuses, becomes a warning and a full cache:
// planning and inspecting open any file). num_params and weight_bytes are the sums over the
// file's tensors.
Result<ModelShape> read_model_shape(const GgufFile& file);
// The shape of a model kvlm has loaded (llama family: K and V heads of head_dim; no MLA; its
// local layers).
// Weight bytes and parameters are not in a config: 0 (unknown).
ModelShape model_shape_from_config(const ModelConfig& config);
// Opens `path` and reads its shape; the name is the file name.
Result<ModelShape> load_model_shape(const std::string& path);

}  // namespace kvlm
