#include "engine/generator.h"

#include <algorithm>
#include <chrono>

#include "cache/kv_cache_manager.h"
#include "kv/kv_storage.h"
#include "model/llama_model.h"
#include "reference/reference_forward.h"

namespace kvlm {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Emits only the text that decoding the longer sequence adds, so tokenizer rules
// that look at neighbours (the SPM leading space) apply exactly as in decode().
class IncrementalDecoder {
 public:
  IncrementalDecoder(const Tokenizer& tokenizer, const Generator::TextCallback& on_text)
      : tokenizer_(tokenizer), on_text_(on_text) {}
  void update(const std::vector<TokenId>& tokens) {
    text_ = tokenizer_.decode(tokens);
    if (text_.size() > emitted_ && on_text_) on_text_(std::string_view(text_).substr(emitted_));
    emitted_ = std::max(emitted_, text_.size());
  }
  const std::string& text() const { return text_; }

 private:
  const Tokenizer& tokenizer_;
  const Generator::TextCallback& on_text_;
  std::string text_;
  size_t emitted_ = 0;
};

}  // namespace

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
  // Only a contiguous window keeps every query within the budget of its keys; H2O and SnapKV keep
  // old tokens at their text positions, so the model's context still bounds them.
  const bool past_context_ok = policy == EvictionPolicy::kWindow || policy == EvictionPolicy::kStreaming;
  if (num_prompt > config.context_length && !past_context_ok) {
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
  const int64_t wanted = options.max_tokens == 0 ? config.context_length
                                                 : static_cast<int64_t>(num_prompt) + options.max_tokens;
  const int64_t cap = past_context_ok ? (int64_t{1} << 30) : config.context_length;
  const int limit = static_cast<int>(std::min<int64_t>(wanted, cap));
  const int capacity = std::max(limit, num_prompt);
  const int num_blocks =
      EvictingSequence::max_blocks(options.eviction, options.block_size, options.prefill_chunk, capacity);
  const KvLayout layout{config.num_layers, config.num_kv_heads, config.head_dim, options.block_size};
  KVLM_ASSIGN_OR_RETURN(std::unique_ptr<KvStorage> storage,
                        KvStorage::create(layout, options.k_type, options.v_type, num_blocks, options.storage));
  KvCacheManager cache(num_blocks, options.block_size);
  auto sequence = std::make_unique<EvictingSequence>(model_, cache, *storage, options.eviction);

  GenerationResult result;
  GenerationStats& stats = result.stats;
  stats.prompt_tokens = num_prompt;
  stats.block_size = options.block_size;
  stats.kv_bytes_per_token = storage->bytes_per_token();
  stats.kv_pool_bytes = storage->allocated_bytes();
  stats.threads = pool_.num_threads();

  Sampler sampler(options.sampler);
  IncrementalDecoder decoder(model_.tokenizer(), on_text);
  std::vector<TokenId>& tokens = result.tokens;
  tokens = prompt;
  decoder.update(tokens);

  std::vector<float> logits;
  std::vector<float> step_logits;  // [verified rows, vocab] kept only when verifying
  const LogitsRows prefill_rows = options.verify ? LogitsRows::kAll : LogitsRows::kLast;
  const uint64_t kv_before = model_.kv_projections_computed();

  auto run_step = [&](std::span<const TokenId> new_tokens, LogitsRows rows) -> Status {
    KVLM_RETURN_IF_ERROR(sequence->forward(new_tokens, rows, pool_, logits));
    stats.kv_blocks_peak = std::max(stats.kv_blocks_peak, sequence->stats().peak_blocks);
    stats.kv_staging_bytes_peak = std::max<uint64_t>(stats.kv_staging_bytes_peak, storage->staging_bytes());
    if (options.verify) step_logits.insert(step_logits.end(), logits.begin(), logits.end());
    return Status::ok_status();
  };

  // Prefill in chunks; the last chunk's last row predicts the first new token.
  auto start = std::chrono::steady_clock::now();
  for (int done = 0; done < num_prompt;) {
    const int n = std::min(options.prefill_chunk, num_prompt - done);
    KVLM_RETURN_IF_ERROR(
        run_step(std::span<const TokenId>(prompt).subspan(static_cast<size_t>(done), static_cast<size_t>(n)),
                 prefill_rows));
    done += n;
  }
  // Without a cache, the prompt is projected once too, but every decode step
  // re-projects its whole context (counted in the loop below).
  stats.kv_projections_recompute = static_cast<uint64_t>(num_prompt);
  stats.prefill_seconds = seconds_since(start);

  const size_t vocab = static_cast<size_t>(config.vocab_size);
  start = std::chrono::steady_clock::now();
  while (static_cast<int>(tokens.size()) < limit) {
    const std::span<const float> last(logits.data() + logits.size() - vocab, vocab);
    const TokenId next = sampler.sample(last, tokens);
    const bool is_stop = next == model_.tokenizer().eos_id() || next == model_.tokenizer().bos_id();
    if (options.stop_at_eos && is_stop) break;
    tokens.push_back(next);
    ++stats.generated_tokens;
    decoder.update(tokens);
    if (static_cast<int>(tokens.size()) >= limit) break;  // the last token needs no forward
    stats.kv_projections_recompute += tokens.size();
    KVLM_RETURN_IF_ERROR(run_step(std::span<const TokenId>(&tokens.back(), 1), LogitsRows::kLast));
  }
  stats.decode_seconds = seconds_since(start);
  stats.kv_projections_cached = model_.kv_projections_computed() - kv_before;
  stats.kv_bytes_allocated = static_cast<uint64_t>(stats.kv_blocks_peak) * storage->bytes_per_block();

  stats.kv_tokens_cached = sequence->num_live();
  stats.eviction = sequence->stats();
  sequence.reset();  // ends the sequence: its blocks and staging go back
  stats.blocks_leaked = num_blocks - cache.num_free_blocks();
  result.text = decoder.text();

  if (options.verify) {
    // Every forwarded token has a logits row; the reference recomputes them all without a cache.
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
