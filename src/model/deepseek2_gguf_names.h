// GGUF names of the DeepSeek-V2 family (architecture "deepseek2"): multi-head latent attention
// and mixture-of-experts FFNs, as llama.cpp's converters write them. Dims are GGUF's, inputs first.
#pragma once

namespace kvlm::deepseek2_names {

inline constexpr const char* kArchitecture = "deepseek2";

// Metadata suffixes ("deepseek2.<suffix>").
inline constexpr const char* kQLoraRank = "attention.q_lora_rank";    // absent or 0: plain attn_q
inline constexpr const char* kKvLoraRank = "attention.kv_lora_rank";
// Newer converters write the MQA view of MLA: head_count_kv 1, key_length = kv_lora + rope,
// value_length = kv_lora, and the per-head sizes here. Older ones: key/value_length per head.
inline constexpr const char* kKeyLengthMla = "attention.key_length_mla";
inline constexpr const char* kValueLengthMla = "attention.value_length_mla";
inline constexpr const char* kLeadingDenseBlockCount = "leading_dense_block_count";
inline constexpr const char* kExpertFeedForwardLength = "expert_feed_forward_length";
inline constexpr const char* kExpertCount = "expert_count";
inline constexpr const char* kExpertUsedCount = "expert_used_count";
inline constexpr const char* kExpertSharedCount = "expert_shared_count";
inline constexpr const char* kExpertWeightsScale = "expert_weights_scale";
inline constexpr const char* kExpertWeightsNorm = "expert_weights_norm";
inline constexpr const char* kExpertGatingFunc = "expert_gating_func";  // 1 softmax, 2 sigmoid
inline constexpr const char* kExpertGroupCount = "expert_group_count";  // V3 group-limited routing
inline constexpr const char* kExpertGroupUsedCount = "expert_group_used_count";
inline constexpr const char* kRopeYarnLogMultiplier = "rope.scaling.yarn_log_multiplier";

inline constexpr unsigned kGatingSoftmax = 1;
inline constexpr unsigned kGatingSigmoid = 2;

// Tensor names inside "blk.N.".
inline constexpr const char* kAttnQA = "attn_q_a.weight";            // {dim, q_lora}
inline constexpr const char* kAttnQANorm = "attn_q_a_norm.weight";   // {q_lora}
inline constexpr const char* kAttnQB = "attn_q_b.weight";            // {q_lora, heads*(nope+rope)}
inline constexpr const char* kAttnKvAMqa = "attn_kv_a_mqa.weight";   // {dim, kv_lora+rope}
inline constexpr const char* kAttnKvANorm = "attn_kv_a_norm.weight"; // {kv_lora}
inline constexpr const char* kAttnKvB = "attn_kv_b.weight";          // {kv_lora, heads*(nope+v)}
inline constexpr const char* kAttnKB = "attn_k_b.weight";            // {nope, kv_lora, heads}: W_UK_h transposed
inline constexpr const char* kAttnVB = "attn_v_b.weight";            // {kv_lora, v, heads}
inline constexpr const char* kFfnGateInp = "ffn_gate_inp.weight";    // {dim, experts} router
inline constexpr const char* kFfnGateExps = "ffn_gate_exps.weight";  // {dim, expert_ffn, experts}
inline constexpr const char* kFfnUpExps = "ffn_up_exps.weight";      // {dim, expert_ffn, experts}
inline constexpr const char* kFfnDownExps = "ffn_down_exps.weight";  // {expert_ffn, dim, experts}
inline constexpr const char* kFfnGateShexp = "ffn_gate_shexp.weight";// {dim, expert_ffn*shared}
inline constexpr const char* kFfnUpShexp = "ffn_up_shexp.weight";
inline constexpr const char* kFfnDownShexp = "ffn_down_shexp.weight";// {expert_ffn*shared, dim}
inline constexpr const char* kExpProbsBias = "exp_probs_b.bias";     // {experts} sigmoid routing bias

}  // namespace kvlm::deepseek2_names
