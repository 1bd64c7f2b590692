#include "eval/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "cache/kv_cache_manager.h"
#include "core/check.h"
#include "evict/evicting_sequence.h"
#include "engine/release_sequence.h"
#include "kv/kv_storage.h"
#include "kv/local_window_hold.h"
#include "model/llama_model.h"

namespace kvlm {

WindowPlan plan_windows(int64_t num_tokens, int ctx, int max_windows) {
  KVLM_CHECK(ctx >= 2, "ctx {} too small", ctx);
  WindowPlan plan;
  const int64_t complete = num_tokens / ctx;
  plan.num_windows = static_cast<int>(max_windows > 0 ? std::min<int64_t>(complete, max_windows) : complete);
  plan.first_scored = ctx / 2;
  plan.scored_per_window = ctx - 1 - plan.first_scored;
  plan.num_scored = static_cast<int64_t>(plan.num_windows) * plan.scored_per_window;
  return plan;
}

void log_softmax(std::span<const float> logits, std::vector<double>& out) {
  out.resize(logits.size());
  double max_logit = -INFINITY;
  for (float x : logits) max_logit = std::max(max_logit, static_cast<double>(x));
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - max_logit);
  const double log_norm = max_logit + std::log(sum);
  for (size_t v = 0; v < logits.size(); ++v) out[v] = static_cast<double>(logits[v]) - log_norm;
}

void score_rows(std::span<const float> logits, int vocab, std::span<const TokenId> targets,
                std::vector<double>& nll) {
  KVLM_CHECK(logits.size() == targets.size() * static_cast<size_t>(vocab), "{} logits for {} rows of vocab {}",
             logits.size(), targets.size(), vocab);
  std::vector<double> log_probs;  // [vocab]
  for (size_t r = 0; r < targets.size(); ++r) {
    KVLM_CHECK(targets[r] >= 0 && targets[r] < vocab, "target {} outside vocab {}", targets[r], vocab);
    log_softmax(logits.subspan(r * static_cast<size_t>(vocab), static_cast<size_t>(vocab)), log_probs);
    nll.push_back(-log_probs[static_cast<size_t>(targets[r])]);
  }
}

PerplexityStats perplexity_from_nll(std::span<const double> nll) {
  PerplexityStats s;
  s.num_scored = static_cast<int64_t>(nll.size());
  if (nll.empty()) return s;
  double sum = 0;
  for (double x : nll) sum += x;
  s.mean_nll = sum / static_cast<double>(nll.size());
  if (nll.size() > 1) {
    double sq = 0;
    for (double x : nll) sq += (x - s.mean_nll) * (x - s.mean_nll);
    const double n = static_cast<double>(nll.size());
    s.nll_stderr = std::sqrt(sq / (n - 1) / n);
  }
  s.ppl = std::exp(s.mean_nll);
  s.ppl_stderr = s.ppl * s.nll_stderr;
  return s;
}

Result<PerplexityResult> evaluate_perplexity(LlamaModel& model, ThreadPool& pool, std::span<const TokenId> tokens,
                                             const PerplexityOptions& options, const ScoredTokenFn& on_scored) {
  const ModelConfig& config = model.config();
  const int ctx = options.ctx;
  if (ctx < 8 || ctx > config.context_length) {
    return Status::errorf("--ctx {} must be in [8, {}] (the model's context)", ctx, config.context_length);
  }
  if (options.block_size < 1 || options.block_size > 4096) {
    return Status::errorf("--block-size {} must be in [1, 4096]", options.block_size);
  }
  if (options.prefill_chunk < 1) return Status::errorf("prefill chunk {} must be positive", options.prefill_chunk);
  if (options.max_windows < 0) return Status::errorf("--max-chunks {} must be >= 0", options.max_windows);
  if (static_cast<int64_t>(tokens.size()) < ctx) {
    return Status::errorf("the text has {} tokens; one window of --ctx {} needs at least {} tokens", tokens.size(),
                          ctx, ctx);
  }
  for (TokenId id : tokens) {
    if (id < 0 || id >= config.vocab_size) return Status::errorf("text token {} is outside the vocabulary", id);
  }

  PerplexityResult result;
  result.plan = plan_windows(static_cast<int64_t>(tokens.size()), ctx, options.max_windows);
  result.num_text_tokens = static_cast<int64_t>(tokens.size());
  KVLM_RETURN_IF_ERROR(validate_eviction_options(options.eviction));
  const bool evicting = options.eviction.policy != EvictionPolicy::kNone;
  const int num_blocks = EvictingSequence::max_blocks(options.eviction, options.block_size, ctx, ctx);
  const KvLayout layout = config.kv_layout(options.block_size);
  KvStorageOptions storage_options = options.storage;
  // An evicting sequence runs its steps as its policy says (up to the whole window at once), and
  // its compactions pin their destination blocks before the sources let go: room for two.
  keep_local_windows(config.sliding_window, options.block_size, evicting ? 2 : 1,
                     evicting ? ctx : std::min(options.prefill_chunk, ctx), num_blocks, storage_options);
  KVLM_ASSIGN_OR_RETURN(std::unique_ptr<KvStorage> storage,
                        KvStorage::create(layout, options.k_type, options.v_type, num_blocks, storage_options));
  KvCacheManager cache(num_blocks, options.block_size);
  result.kv_bytes_per_token = storage->bytes_per_token();
  result.kv_bytes_formula = result.kv_bytes_per_token * static_cast<uint64_t>(ctx);

  const Tokenizer& tok = model.tokenizer();
  const bool put_bos = tok.add_bos() && tok.bos_id() >= 0;
  const size_t vocab = static_cast<size_t>(config.vocab_size);
  const int first = result.plan.first_scored;
  std::vector<TokenId> window(static_cast<size_t>(ctx));  // [ctx]
  std::vector<float> logits;                               // [rows, vocab] of one forward
  std::vector<double> log_probs;                           // [vocab]
  std::vector<double> nll;                                 // [num_scored]
  nll.reserve(static_cast<size_t>(result.plan.num_scored));

  const auto start = std::chrono::steady_clock::now();
  for (int w = 0; w < result.plan.num_windows; ++w) {
    const auto begin = tokens.begin() + static_cast<ptrdiff_t>(w) * ctx;
    std::copy(begin, begin + ctx, window.begin());
    if (put_bos) window[0] = tok.bos_id();
    // Row r of `logits` is position `done` + r; it predicts window[done + r + 1].
    auto score = [&](int done, int n) -> Status {
      for (int j = std::max(done, first); j < std::min(done + n, ctx - 1); ++j) {
        const size_t r = static_cast<size_t>(j - done);
        log_softmax(std::span<const float>(logits).subspan(r * vocab, vocab), log_probs);
        const TokenId target = window[static_cast<size_t>(j + 1)];
        nll.push_back(-log_probs[static_cast<size_t>(target)]);
        if (on_scored) KVLM_RETURN_IF_ERROR(on_scored(log_probs, target));
      }
      return Status::ok_status();
    };
    if (evicting) {
      EvictingSequence sequence(model, cache, *storage, options.eviction);
      const std::span<const TokenId> all(window);
      KVLM_RETURN_IF_ERROR(sequence.forward(all.first(static_cast<size_t>(first)), LogitsRows::kLast, pool, logits));
      KVLM_RETURN_IF_ERROR(sequence.forward(all.subspan(static_cast<size_t>(first)), LogitsRows::kAll, pool, logits));
      result.kv_blocks_peak = std::max(result.kv_blocks_peak, sequence.stats().peak_blocks);
      result.kv_staging_bytes_peak = std::max<uint64_t>(result.kv_staging_bytes_peak, storage->staging_bytes());
      result.eviction.add(sequence.stats());
      KVLM_RETURN_IF_ERROR(score(first, ctx - first));
      continue;
    }
    const SeqId seq = cache.create_sequence();
    LocalWindowHold local_hold;  // the sliding-window layers' pins (no-op without them)
    Status status = Status::ok_status();
    for (int done = 0; done < ctx && status.ok();) {
      const int n = std::min(options.prefill_chunk, ctx - done);
      // Rows before `first` are never scored: skip the vocabulary projection for them.
      const LogitsRows rows = done + n <= first ? LogitsRows::kLast : LogitsRows::kAll;
      KVLM_CHECK(cache.reserve(seq, n), "pool of {} blocks sized for ctx {} has no room", num_blocks, ctx);
      const std::vector<int32_t> table = cache.table(seq).block_ids();
      KVLM_CHECK(local_hold.extend(*storage, table), "the local slots sized for one sequence ran out");
      model.forward(SequenceStep{std::span<const TokenId>(window).subspan(static_cast<size_t>(done),
                                                                            static_cast<size_t>(n)),
                                 done, table, rows},
                    *storage, pool, logits);
      cache.append(seq, n);
      if (config.sliding_window.any()) local_hold.release_before(*storage, table, done + n - config.sliding_window.window + 1);
      result.kv_blocks_peak = std::max(result.kv_blocks_peak, cache.num_used_blocks());
      result.kv_staging_bytes_peak = std::max<uint64_t>(result.kv_staging_bytes_peak, storage->staging_bytes());
      if (rows == LogitsRows::kAll) status = score(done, n);
      done += n;
    }
    local_hold.release_all(*storage, cache.table(seq).block_ids());
    release_sequence(cache, *storage, seq);
    if (!status.ok()) return status;
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.kv_local_blocks_peak = storage->peak_local_blocks_in_use();
  result.kv_bytes_peak = static_cast<uint64_t>(result.kv_blocks_peak) * storage->bytes_per_block() +
                         static_cast<uint64_t>(result.kv_local_blocks_peak) * storage->local_bytes_per_block();
  result.stats = perplexity_from_nll(nll);
  KVLM_CHECK(result.stats.num_scored == result.plan.num_scored, "scored {} tokens, planned {}",
             result.stats.num_scored, result.plan.num_scored);
  return result;
}

}  // namespace kvlm
