// The deepseek2 part of synthesize_model: DeepSeek-V2's keys and tensors, as llama.cpp's converters write them.
//
// Metadata ("deepseek2." + key): block_count, context_length, embedding_length, feed_forward_length (the
// dense FFN), attention.head_count, attention.layer_norm_rms_epsilon, rope.freq_base, rope.dimension_count
// (= qk_rope_dim), leading_dense_block_count, attention.q_lora_rank (only when > 0), attention.kv_lora_rank,
// expert_feed_forward_length, expert_count, expert_used_count, expert_shared_count, expert_weights_scale,
// expert_weights_norm (bool), expert_gating_func (u32: 1 softmax, 2 sigmoid), vocab_size; YaRN as
// rope.scaling.{type, factor, original_context_length} and rope.scaling.yarn_log_multiplier (when non-zero).
// The attention lengths depend on the layout:
//   kv_b  (older converters)  head_count_kv = heads, key_length = nope + rope, value_length = v
//   split (newer: MLA seen as MQA over the latent)  head_count_kv = 1, key_length = kv_lora + rope,
//         value_length = kv_lora, key_length_mla = nope + rope, value_length_mla = v
#pragma once

#include <cstdint>

#include "core/status.h"
#include "model/model_synthesizer.h"

namespace kvlm {

class GgufWriter;

namespace synth_internal {

class SynthTensorGenerator;

// A deepseek2 shape's MLA and MoE fields (and what deepseek2 does not have); errors name the field.
Status validate_deepseek2_shape(const SynthShape& s);
// Another architecture's shape: every deepseek2 field at its default, else an error naming it.
Status check_no_deepseek2_fields(const SynthShape& s);

int64_t deepseek2_num_parameters(const SynthShape& s);

// The keys above that differ from the llama family's (the shared ones are the caller's).
void add_deepseek2_metadata(GgufWriter& w, const SynthShape& s);
// Every block's tensors (token_embd, output_norm and output are the caller's).
void add_deepseek2_layers(SynthTensorGenerator& gen, const SynthShape& s);

}  // namespace synth_internal
}  // namespace kvlm
