#include "eval/stream_perplexity.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>

#include "core/check.h"
#include "model/llama_model.h"

namespace kvlm {

Result<StreamResult> evaluate_stream(LlamaModel& model, ThreadPool& pool, std::span<const TokenId> tokens,
                                     const StreamOptions& options) {
  const ModelConfig& config = model.config();
  const int64_t num_given = static_cast<int64_t>(tokens.size());
  const int64_t n = options.num_tokens > 0 ? options.num_tokens : num_given;
  if (options.num_tokens < 0) return Status::errorf("--tokens {} must be positive", options.num_tokens);
  if (n < 2) return Status::errorf("a stream needs at least 2 tokens (BOS and one to predict); got {}", n);
  if (num_given < n) {
    return Status::errorf("the text has {} tokens (BOS included); --tokens {} needs at least {}", num_given, n, n);
  }
  if (options.segment < 1) return Status::errorf("--segment {} must be at least 1", options.segment);
  if (options.chunk < 1) return Status::errorf("--chunk {} must be at least 1", options.chunk);
  if (options.trained_ctx < 0) return Status::errorf("--trained-ctx {} must be >= 0", options.trained_ctx);
  const std::span<const TokenId> stream = tokens.first(static_cast<size_t>(n));
  for (TokenId id : stream) {
    if (id < 0 || id >= config.vocab_size) {
      return Status::errorf("text token {} is outside the vocabulary of {}", id, config.vocab_size);
    }
  }

  StreamResult result;
  result.num_tokens = n;
  result.trained_ctx = options.trained_ctx > 0 ? options.trained_ctx : config.context_length;
  EvalCacheRequest request;
  request.options = options.cache;
  request.max_tokens = n;
  KVLM_ASSIGN_OR_RETURN(std::unique_ptr<EvalSequenceCache> cache,
                        make_eval_cache(options.make_cache, model, pool, request));
  result.kv_bytes_per_block = cache->bytes_per_block();

  // Only tokens [0, n - 1) are fed: the last token is a target and its row would predict nothing.
  const int64_t num_rows = n - 1;
  const int64_t segment = options.segment;
  const size_t vocab = static_cast<size_t>(config.vocab_size);
  std::vector<double> nll;        // [num_rows], by predicting position
  nll.reserve(static_cast<size_t>(num_rows));
  std::vector<float> logits;      // [rows, vocab] of one forward
  std::vector<double> log_probs;  // [vocab]

  const auto start = std::chrono::steady_clock::now();
  for (int64_t pos = 0; pos < num_rows;) {
    // Forwards end at segment boundaries, so the cache is measured exactly at each segment's end.
    const int64_t segment_end = std::min(num_rows, (pos / segment + 1) * segment);
    const int64_t end = std::min(segment_end, pos + options.chunk);
    KVLM_CHECK(cache->num_fed() == pos, "cache was fed {} tokens, the stream is at {}", cache->num_fed(), pos);
    cache->forward(stream.subspan(static_cast<size_t>(pos), static_cast<size_t>(end - pos)), LogitsRows::kAll,
                   logits);
    KVLM_CHECK(logits.size() == static_cast<size_t>(end - pos) * vocab, "{} logits for {} rows", logits.size(),
               end - pos);
    for (int64_t p = pos; p < end; ++p) {
      log_softmax(std::span<const float>(logits).subspan(static_cast<size_t>(p - pos) * vocab, vocab), log_probs);
      nll.push_back(-log_probs[static_cast<size_t>(stream[static_cast<size_t>(p + 1)])]);
    }
    result.kv_bytes_peak =
        std::max(result.kv_bytes_peak, static_cast<uint64_t>(cache->peak_blocks_held()) * cache->bytes_per_block());
    result.kv_cached_peak = std::max(result.kv_cached_peak, cache->peak_cached());
    if (end == segment_end) {
      StreamSegment s;
      s.index = static_cast<int>(result.segments.size());
      s.first_position = (pos / segment) * segment;
      s.end_position = end;
      s.stats = perplexity_from_nll(std::span<const double>(nll).subspan(static_cast<size_t>(s.first_position)));
      s.num_past_context = std::max<int64_t>(0, end - std::max<int64_t>(s.first_position, result.trained_ctx));
      s.kv_cached_tokens = cache->num_cached();
      s.kv_blocks = cache->num_blocks_held();
      s.kv_bytes = cache->bytes_held();
      result.segments.push_back(s);
    }
    pos = end;
  }

  if (options.in_context_reference) {
    // ref_nll[p]: the prediction at position p, made with a fresh cache over at most trained_ctx tokens.
    std::vector<double> ref_nll(static_cast<size_t>(num_rows));
    const int64_t piece = std::max<int64_t>(1, result.trained_ctx / 2);
    EvalCacheRequest full_request;
    full_request.options = options.cache;
    full_request.max_tokens = std::max<int64_t>(1, std::min<int64_t>(n, result.trained_ctx));
    KVLM_ASSIGN_OR_RETURN(std::unique_ptr<EvalSequenceCache> full, make_full_eval_cache(model, pool, full_request));
    for (int64_t a = 0; a < num_rows; a += piece) {
      const int64_t b = std::min(num_rows, a + piece);
      const int64_t first = std::max<int64_t>(0, b - result.trained_ctx);
      full->reset();
      for (int64_t pos = first; pos < b;) {
        const int64_t end = std::min(b, pos + options.chunk);
        full->forward(stream.subspan(static_cast<size_t>(pos), static_cast<size_t>(end - pos)), LogitsRows::kAll,
                      logits);
        for (int64_t p = std::max(pos, a); p < end; ++p) {
          log_softmax(std::span<const float>(logits).subspan(static_cast<size_t>(p - pos) * vocab, vocab), log_probs);
          ref_nll[static_cast<size_t>(p)] = -log_probs[static_cast<size_t>(stream[static_cast<size_t>(p + 1)])];
        }
        pos = end;
      }
    }
    const std::span<const double> ref(ref_nll);
    result.reference = perplexity_from_nll(ref);
    result.max_segment_excess = -std::numeric_limits<double>::infinity();
    for (StreamSegment& s : result.segments) {
      s.reference = perplexity_from_nll(ref.subspan(static_cast<size_t>(s.first_position),
                                                    static_cast<size_t>(s.end_position - s.first_position)));
      result.max_segment_excess = std::max(result.max_segment_excess, s.stats.ppl / s.reference.ppl - 1.0);
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const std::span<const double> all(nll);
  const size_t split = static_cast<size_t>(std::min<int64_t>(num_rows, result.trained_ctx));
  result.overall = perplexity_from_nll(all);
  result.in_context = perplexity_from_nll(all.first(split));
  result.past_context = perplexity_from_nll(all.subspan(split));
  return result;
}

}  // namespace kvlm
