// read_deepseek2_config: the attention (MLA), RoPE and expert (MoE) hyper-parameters of a
// DeepSeek-V2-family GGUF file, both metadata conventions in the wild.
#pragma once

#include "core/status.h"
#include "model/model_config.h"

namespace kvlm {

class GgufFile;

// Fills c.num_kv_heads (1), c.head_dim (the cached row), c.mla, c.moe, c.rope (the shared RoPE
// key's dims), c.rope_scaling* and c.attention_scale; c's common fields (layers, dim, heads, ffn,
// context, rms eps) must be read already. Every field it cannot honour is an error naming it.
Status read_deepseek2_config(const GgufFile& file, ModelConfig& c);

}  // namespace kvlm
