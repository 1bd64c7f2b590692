#include "engine/generator.h"

#include <algorithm>

#include "engine/engine.h"
#include "kv/kv_storage.h"
#include "model/incremental_detokenizer.h"
#include "model/llama_model.h"
#include "reference/reference_forward.h"

namespace kvlm {
double GenerationStats::prefill_tokens_per_second() const {
  return prefill_seconds > 0 ? prompt_tokens / prefill_seconds : 0;
}

double GenerationStats::decode_tokens_per_second() const {
  // The first generated token comes out of prefill; decode steps produce the rest.
  const int decode_steps = std::max(0, generated_tokens - 1);
  return decode_seconds > 0 ? decode_steps / decode_seconds : 0;
}

Result<GenerationResult> Generator::generate(const std::vector<TokenId>& prompt, const GenerationOptions& options,
                                             const TextCallback& on_text) {
  const ModelConfig& config = model_.config();
  if (prompt.empty()) return Status::error("the prompt is empty (it needs at least BOS)");
  for (TokenId id : prompt) {
    if (id < 0 || id >= config.vocab_size) return Status::errorf("prompt token {} is outside the vocabulary", id);
  }
  const int num_prompt = static_cast<int>(prompt.size());
  KVLM_RETURN_IF_ERROR(validate_eviction_options(options.eviction));
  const EvictionPolicy policy = options.eviction.policy;
  if (num_prompt > config.context_length && !window_policy(policy)) {
    return Status::errorf("the prompt has {} tokens, more than the model's context of {} (--policy window or "
                          "streaming can run past it)",
                          num_prompt, config.context_length);
  }
  if (options.max_tokens < 0) return Status::errorf("--max-tokens {} must be >= 0", options.max_tokens);
  if (options.block_size < 1 || options.block_size > 4096) {
    return Status::errorf("--block-size {} must be in [1, 4096]", options.block_size);
  }
  if (options.prefill_chunk < 1) return Status::error("prefill chunk must be positive");
  if (options.verify && policy != EvictionPolicy::kNone) {
    return Status::error("--verify compares with a full recomputation, which an evicting cache does not equal; "
                         "drop --policy or --verify");
  }
  KVLM_RETURN_IF_ERROR(options.sampler.validate());

  // The sequence may grow to `limit` tokens; the last one is sampled but never forwarded.
  const int limit = request_token_limit(config, num_prompt, options.max_tokens, policy);
  const int capacity = std::max(limit, num_prompt);
  const int num_blocks =
      EvictingSequence::max_blocks(options.eviction, options.block_size, options.prefill_chunk, capacity);

  // One request through the engine: the same scheduler, batched forward and sampler as many
  // requests, with a pool sized for this one and chunks of prefill_chunk tokens.
  EngineOptions engine_options;
  engine_options.k_type = options.k_type;
  engine_options.v_type = options.v_type;
  engine_options.storage = options.storage;
  engine_options.block_size = options.block_size;
  engine_options.num_blocks = num_blocks;
  engine_options.max_batch_tokens = options.prefill_chunk;
  engine_options.max_seqs = 1;
  engine_options.prefix_caching = false;
  KVLM_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::create(model_, pool_, engine_options));

  GenerationResult result;
  GenerationStats& stats = result.stats;
  stats.prompt_tokens = num_prompt;
  stats.block_size = options.block_size;
  stats.kv_bytes_per_token = engine->storage().bytes_per_token();
  stats.kv_pool_bytes = engine->storage().allocated_bytes();
  stats.threads = pool_.num_threads();

  RequestOptions request;
  request.prompt = prompt;
  request.sampler = options.sampler;
  request.max_tokens = options.max_tokens;
  request.stop_at_eos = options.stop_at_eos;
  request.eviction = options.eviction;
  request.logits = options.verify ? LogitsCapture::kAll : LogitsCapture::kNone;

  // The prompt's text first, as decode() prints it; the engine streams the rest.
  IncrementalDetokenizer prompt_text(model_.tokenizer());
  std::string text = prompt_text.set_prompt(prompt);
  if (!text.empty() && on_text) on_text(text);
  std::vector<TokenId>& tokens = result.tokens;
  tokens = prompt;
  std::vector<float> step_logits;  // [forwarded tokens, vocab], only when verifying
  FinishReason finish = FinishReason::kNone;
  std::string error;
  RequestStats request_stats;
  const uint64_t kv_before = model_.kv_projections_computed();
  auto on_event = [&](const TokenEvent& e) {
    if (e.token >= 0) tokens.push_back(e.token);
    if (!e.text.empty()) {
      text += e.text;
      if (on_text) on_text(e.text);
    }
    if (e.logits) step_logits.insert(step_logits.end(), e.logits->begin(), e.logits->end());
    if (e.finish != FinishReason::kNone) {
      finish = e.finish;
      error = e.error;
      request_stats = *e.stats;
    }
  };
  KVLM_RETURN_IF_ERROR(engine->submit(std::move(request), on_event).status());
  engine->run_until_idle();
  if (finish == FinishReason::kError) return Status::error(error);

  stats.generated_tokens = request_stats.completion_tokens;
  stats.prefill_seconds = request_stats.time_to_first_token;
  stats.decode_seconds = std::max(0.0, request_stats.total_seconds - request_stats.time_to_first_token);
  // Without a cache the prompt is projected once too, but every decode forward re-projects
  // its whole context; the last token is not forwarded when generation ended at the limit.
  const int decode_forwards = stats.generated_tokens - (finish == FinishReason::kLength ? 1 : 0);
  stats.kv_projections_recompute = static_cast<uint64_t>(num_prompt);
  for (int k = 1; k <= decode_forwards; ++k) stats.kv_projections_recompute += static_cast<uint64_t>(num_prompt + k);
  stats.kv_projections_cached = model_.kv_projections_computed() - kv_before;
  stats.kv_blocks_peak = request_stats.peak_blocks;
  // Local (sliding-window) layers hold their own slots: at most the window and a step's worth.
  stats.kv_local_blocks_peak = engine->storage().peak_local_blocks_in_use();
  stats.kv_bytes_allocated =
      static_cast<uint64_t>(stats.kv_blocks_peak) * engine->storage().bytes_per_block() +
      static_cast<uint64_t>(stats.kv_local_blocks_peak) * engine->storage().local_bytes_per_block();
  stats.kv_staging_bytes_peak = engine->metrics().peak_staging_bytes;
  stats.kv_tokens_cached = request_stats.live_tokens;
  stats.eviction = request_stats.eviction;
  // Nothing runs now: every block (and every local slot) must be back.
  stats.blocks_leaked = engine->cache().num_used_blocks() + engine->storage().local_blocks_in_use();
  result.text = text;

  if (options.verify) {
    // Every forwarded token has a logits row; the reference recomputes them all without a cache.
    const size_t vocab = static_cast<size_t>(config.vocab_size);
    const size_t num_forwarded = step_logits.size() / vocab;
    const std::vector<double> expected =
        reference_logits(config, model_.weights(), std::span<const TokenId>(tokens.data(), num_forwarded));
    double worst = 0;
    for (size_t t = 0; t < num_forwarded; ++t) {
      worst = std::max(worst, max_relative_error(std::span<const float>(step_logits).subspan(t * vocab, vocab),
                                                 std::span<const double>(expected).subspan(t * vocab, vocab)));
    }
    stats.verified = true;
    stats.verify_max_rel_error = worst;
  }
  return result;
}

}  // namespace kvlm
