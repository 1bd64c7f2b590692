// bind_deepseek2_layer: one DeepSeek-V2-family layer's tensors (MLA attention, dense or MoE FFN)
// as views into the file, in either up-projection layout (attn_kv_b, or attn_k_b + attn_v_b).
#pragma once

#include "model/llama_weights.h"
#include "model/model_config.h"
#include "model/tensor_binder.h"

namespace kvlm {

// Binds layer `layer` into `out`; problems go to `binder`. A file with only attn_kv_b gets its
// W_UK_hᵀ transposed to f32 into `derived` (which `out` then points into).
void bind_deepseek2_layer(TensorBinder& binder, const ModelConfig& c, int layer, LlamaLayerWeights& out,
                          std::vector<std::vector<float>>& derived);

}  // namespace kvlm
