// GGUF names of the llama family: metadata keys and tensor names, as llama.cpp files use them.
#pragma once

#include <string>

#include <fmt/format.h>

namespace kvlm::llama_names {

// Metadata keys are "<arch>.<suffix>", e.g. "llama.block_count".
inline std::string key(const std::string& arch, const char* suffix) { return fmt::format("{}.{}", arch, suffix); }

inline constexpr const char* kArchitecture = "general.architecture";
inline constexpr const char* kName = "general.name";
inline constexpr const char* kFileType = "general.file_type";
inline constexpr const char* kContextLength = "context_length";
inline constexpr const char* kEmbeddingLength = "embedding_length";
inline constexpr const char* kBlockCount = "block_count";
inline constexpr const char* kFeedForwardLength = "feed_forward_length";
inline constexpr const char* kHeadCount = "attention.head_count";
inline constexpr const char* kHeadCountKv = "attention.head_count_kv";
inline constexpr const char* kKeyLength = "attention.key_length";      // head_dim when not dim / heads
inline constexpr const char* kValueLength = "attention.value_length";
inline constexpr const char* kRmsEps = "attention.layer_norm_rms_epsilon";
inline constexpr const char* kRopeDimensionCount = "rope.dimension_count";
inline constexpr const char* kRopeFreqBase = "rope.freq_base";
inline constexpr const char* kRopeScalingType = "rope.scaling.type";   // "none" | "linear" | ...
inline constexpr const char* kRopeScalingFactor = "rope.scaling.factor";
inline constexpr const char* kRopeScaleLinear = "rope.scale_linear";   // older files
inline constexpr const char* kRopeScalingOrigContext = "rope.scaling.original_context_length";
inline constexpr const char* kRopeScalingAttnFactor = "rope.scaling.attn_factor";
inline constexpr const char* kRopeYarnExtFactor = "rope.scaling.yarn_ext_factor";
inline constexpr const char* kRopeYarnAttnFactor = "rope.scaling.yarn_attn_factor";
inline constexpr const char* kRopeYarnBetaFast = "rope.scaling.yarn_beta_fast";
inline constexpr const char* kRopeYarnBetaSlow = "rope.scaling.yarn_beta_slow";
// Llama 3.x rope_scaling parameters, for files without rope_freqs.weight (kvlm's keys).
inline constexpr const char* kRopeLowFreqFactor = "rope.scaling.low_freq_factor";
inline constexpr const char* kRopeHighFreqFactor = "rope.scaling.high_freq_factor";
inline constexpr const char* kRopeFreqBaseSwa = "rope.freq_base_swa";            // gemma3 local layers
inline constexpr const char* kSlidingWindow = "attention.sliding_window";
inline constexpr const char* kSlidingWindowPattern = "attention.sliding_window_pattern";
inline constexpr const char* kVocabSize = "vocab_size";

// Tokenizer keys (not architecture-prefixed).
inline constexpr const char* kTokModel = "tokenizer.ggml.model";
inline constexpr const char* kTokPre = "tokenizer.ggml.pre";
inline constexpr const char* kTokTokens = "tokenizer.ggml.tokens";
inline constexpr const char* kTokScores = "tokenizer.ggml.scores";
inline constexpr const char* kTokTypes = "tokenizer.ggml.token_type";
inline constexpr const char* kTokMerges = "tokenizer.ggml.merges";
inline constexpr const char* kTokBos = "tokenizer.ggml.bos_token_id";
inline constexpr const char* kTokEos = "tokenizer.ggml.eos_token_id";
inline constexpr const char* kTokUnk = "tokenizer.ggml.unknown_token_id";
inline constexpr const char* kTokPad = "tokenizer.ggml.padding_token_id";
inline constexpr const char* kTokAddBos = "tokenizer.ggml.add_bos_token";
inline constexpr const char* kTokAddSpacePrefix = "tokenizer.ggml.add_space_prefix";

// Tensor names. Weight matrices are stored [out, in] row-major: GGUF dims {in, out}.
inline constexpr const char* kTokenEmbd = "token_embd.weight";     // dims {dim, vocab}
inline constexpr const char* kOutputNorm = "output_norm.weight";   // {dim}
inline constexpr const char* kOutput = "output.weight";            // {dim, vocab}; absent when tied
inline constexpr const char* kRopeFreqs = "rope_freqs.weight";     // {rotary_dim / 2} Llama 3.x frequency factors
inline std::string blk(int layer, const char* name) { return fmt::format("blk.{}.{}", layer, name); }
inline constexpr const char* kAttnNorm = "attn_norm.weight";       // {dim}
inline constexpr const char* kAttnQ = "attn_q.weight";             // {dim, heads*head_dim}
inline constexpr const char* kAttnQkv = "attn_qkv.weight";         // {dim, q_dim + 2 kv_dim} phi3: q, k, v rows
inline constexpr const char* kRopeFactorsLong = "rope_factors_long.weight";    // phi3 LongRoPE (128k files)
inline constexpr const char* kRopeFactorsShort = "rope_factors_short.weight";
inline constexpr const char* kAttnK = "attn_k.weight";             // {dim, kv_heads*head_dim}
inline constexpr const char* kAttnV = "attn_v.weight";             // {dim, kv_heads*head_dim}
inline constexpr const char* kAttnQBias = "attn_q.bias";           // qwen2
inline constexpr const char* kAttnKBias = "attn_k.bias";
inline constexpr const char* kAttnVBias = "attn_v.bias";
inline constexpr const char* kAttnOutput = "attn_output.weight";   // {heads*head_dim, dim}
inline constexpr const char* kFfnNorm = "ffn_norm.weight";         // {dim}
inline constexpr const char* kFfnGate = "ffn_gate.weight";         // {dim, ffn}
inline constexpr const char* kFfnUp = "ffn_up.weight";             // {dim, ffn}; phi3 {dim, 2 ffn}: gate rows, then up
inline constexpr const char* kFfnDown = "ffn_down.weight";         // {ffn, dim}
inline constexpr const char* kAttnQNorm = "attn_q_norm.weight";    // {head_dim} qwen3, gemma3: per-head RMSNorm
inline constexpr const char* kAttnKNorm = "attn_k_norm.weight";    // {head_dim}
inline constexpr const char* kAttnPostNorm = "post_attention_norm.weight";  // {dim} gemma3
inline constexpr const char* kFfnPostNorm = "post_ffw_norm.weight";         // {dim} gemma3

}  // namespace kvlm::llama_names
