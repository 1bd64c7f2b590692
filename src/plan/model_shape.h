// ModelShape: the attention shapes and weight size the KV planner needs (presets, GGUF, flags).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/status.h"
#include "gguf/gguf_file.h"
#include "model/model_config.h"

namespace kvlm {

// Only what decides KV memory and weight memory. Deliberately not ModelConfig: the
// planner must also describe models kvlm cannot run yet (deepseek2, 70B presets).
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

  bool is_mla() const { return kv_lora_rank > 0; }
  // Values one token stores per layer in the MLA latent (kv_lora_rank + rope_head_dim).
  int latent_dim() const { return kv_lora_rank + rope_head_dim; }
};

// Every count positive and within sane bounds (the planner's products must not overflow),
// kv heads dividing heads; the message names the field and the value.
Status validate_model_shape(const ModelShape& shape);

// The built-in presets: llama-2-7b, llama-3-8b, llama-3.2-1b, deepseek-v2-lite, deepseek-v2.
std::span<const ModelShape> model_presets();
// The preset called `name` (case-insensitive); an error listing the presets otherwise.
Result<ModelShape> find_preset(std::string_view name);
// "llama-2-7b, llama-3-8b, ...": for errors and --help.
std::string preset_list();

// Reads the shape from GGUF metadata (<arch>.block_count, .attention.head_count[_kv],
// .attention.key_length/.value_length, .context_length; deepseek2 also
// .attention.kv_lora_rank and .rope.dimension_count). num_params and weight_bytes are the
// sums over the file's tensors.
Result<ModelShape> read_model_shape(const GgufFile& file);
// The shape of a model kvlm has loaded (llama family: K and V heads of head_dim; no MLA).
// Weight bytes and parameters are not in a config: 0 (unknown).
ModelShape model_shape_from_config(const ModelConfig& config);
// Opens `path` and reads its shape; the name is the file name.
Result<ModelShape> load_model_shape(const std::string& path);

}  // namespace kvlm
