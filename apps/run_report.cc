#include "run_report.h"

#include <fmt/format.h>

#include "evict/evicting_sequence.h"
#include "model/llama_model.h"
#include "planner_check.h"
#include "startup_report.h"

namespace kvlm::cli {
namespace {

// The planner predicts the peak: without eviction the sequence only grows, so it peaked at the
// tokens it ended with; under a policy, at the most tokens the policy let it hold.
PlannerCheck planner_check(const GenerationStats& s, const LlamaModel& model, const RunDescription& run) {
  const bool evicting = run.eviction.policy != EvictionPolicy::kNone;
  const int64_t peak_tokens = evicting ? s.eviction.peak_live_tokens : s.kv_tokens_cached;
  return check_against_planner(model.config(), run.k_type, run.v_type, s.block_size, {peak_tokens},
                               s.kv_bytes_allocated, run.kivi_residual, s.kv_staging_bytes_peak,
                               EvictingSequence::evicted_slot_blocks(run.eviction),
                               LocalLayerRun{LocalLayerBlocks::kWindow, std::min(run.prefill_chunk, s.prompt_tokens)});
}

}  // namespace

std::string format_stats(const GenerationResult& r, const LlamaModel& model, const RunDescription& run) {
  const GenerationStats& s = r.stats;
  const ModelConfig& c = model.config();
  std::string out;
  out += fmt::format("model            {} ({} {}, {} layers, {} heads / {} kv heads, head_dim {})\n", run.model_path,
                     c.architecture, c.attention_kind(), c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim);
  out += fmt::format("tokens           {} prompt + {} generated, {} threads\n", s.prompt_tokens, s.generated_tokens,
                     s.threads);
  out += fmt::format("start-up         {}; first token {:.3f} s after it\n", describe_load(model.load_stats()),
                     s.prefill_seconds);
  out += fmt::format("prefill          {:.1f} tokens/s ({:.3f} s)\n", s.prefill_tokens_per_second(), s.prefill_seconds);
  out += fmt::format("decode           {:.1f} tokens/s ({:.3f} s)\n", s.decode_tokens_per_second(), s.decode_seconds);
  out += fmt::format("K/V projections  {} computed with the cache, {} by recomputation ({:.1f}x)\n",
                     s.kv_projections_cached, s.kv_projections_recompute,
                     s.kv_projections_cached ? static_cast<double>(s.kv_projections_recompute) / s.kv_projections_cached
                                             : 0.0);
  if (c.is_mla()) {
    // One latent row per layer, no V; beside it what MHA over the same heads would store.
    const uint64_t mha_f16 = 2ull * c.num_layers * c.num_heads * (c.mla.qk_head_dim() + c.mla.v_head_dim);
    out += fmt::format("KV per token     {} bytes = {} layers x {} latent values ({} + {} RoPE) x {} (MLA; MHA over "
                       "the same {} heads: {} bytes in f16)\n",
                       s.kv_bytes_per_token, c.num_layers, c.head_dim, c.mla.kv_lora_rank, c.mla.qk_rope_dim,
                       kv_type_name(run.k_type), c.num_heads, mha_f16);
  } else {
    out += fmt::format("KV per token     {} bytes = 2 x {} layers x {} kv heads x {} dims x K {} / V {}\n",
                       s.kv_bytes_per_token, c.num_layers, c.num_kv_heads, c.head_dim, kv_type_name(run.k_type),
                       kv_type_name(run.v_type));
  }
  out += fmt::format("KV allocated     {} bytes in {} blocks of {} tokens (peak; {} bytes for {} tokens by formula)\n",
                     s.kv_bytes_allocated, s.kv_blocks_peak, s.block_size,
                     s.kv_bytes_per_token * static_cast<uint64_t>(s.kv_tokens_cached), s.kv_tokens_cached);
  if (c.sliding_window.any()) {
    const int local = c.sliding_window.num_local_layers();
    out += fmt::format("KV local layers  {} of {} layers see {} tokens: they held at most {} blocks each (the "
                       "global layers {})\n",
                       local, c.num_layers, c.sliding_window.window, s.kv_local_blocks_peak, s.kv_blocks_peak);
  }
  if (run.eviction.policy != EvictionPolicy::kNone) {
    out += fmt::format("KV eviction      {}: {} tokens evicted, at most {} live, {} blocks dropped, {} tokens moved "
                       "in {} compactions\n",
                       describe_eviction(run.eviction), s.eviction.tokens_evicted, s.eviction.peak_live_tokens,
                       s.eviction.blocks_dropped, s.eviction.tokens_moved, s.eviction.compactions);
  }
  out += planner_check(s, model, run).line();
  out += fmt::format("KV pool          {} bytes reserved, {} blocks leaked\n", s.kv_pool_bytes, s.blocks_leaked);
  if (s.verified) {
    out += fmt::format("verify           cached logits vs no-cache reference: max relative error {:.2e}\n",
                       s.verify_max_rel_error);
  }
  return out;
}

nlohmann::json stats_to_json(const GenerationResult& r, const LlamaModel& model, const RunDescription& run) {
  const GenerationStats& s = r.stats;
  nlohmann::json stats = {
      {"prompt_tokens", s.prompt_tokens},
      {"generated_tokens", s.generated_tokens},
      {"threads", s.threads},
      {"load", load_json(model.load_stats())},
      {"first_token_seconds", s.prefill_seconds},
      {"prefill_seconds", s.prefill_seconds},
      {"decode_seconds", s.decode_seconds},
      {"prefill_tokens_per_second", s.prefill_tokens_per_second()},
      {"decode_tokens_per_second", s.decode_tokens_per_second()},
      {"kv_projections_cached", s.kv_projections_cached},
      {"kv_projections_recompute", s.kv_projections_recompute},
      {"kv_type_k", kv_type_name(run.k_type)},
      {"kv_type_v", kv_type_name(run.v_type)},
      {"kv_planner", planner_check(s, model, run).json()},
      {"kv_bytes_per_token", s.kv_bytes_per_token},
      {"kv_bytes_allocated", s.kv_bytes_allocated},
      {"kv_blocks_peak", s.kv_blocks_peak},
      {"kv_local_blocks_peak", s.kv_local_blocks_peak},
      {"kv_tokens_cached", s.kv_tokens_cached},
      {"block_size", s.block_size},
      {"kv_pool_bytes", s.kv_pool_bytes},
      {"blocks_leaked", s.blocks_leaked},
      {"policy", eviction_policy_name(run.eviction.policy)},
      {"budget", run.eviction.budget},
      {"tokens_evicted", s.eviction.tokens_evicted},
      {"peak_live_tokens", s.eviction.peak_live_tokens},
      {"seed", run.seed},
  };
  if (s.verified) stats["verify_max_rel_error"] = s.verify_max_rel_error;
  return nlohmann::json{{"model", run.model_path},
                        {"architecture", model.config().architecture},
                        {"text", r.text},
                        {"tokens", r.tokens},
                        {"stats", stats}};
}

}  // namespace kvlm::cli
