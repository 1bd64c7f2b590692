// Stream perplexity: one continuous sequence far past the trained context, scored per segment.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/ids.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "eval/eval_sequence_cache.h"
#include "eval/perplexity.h"

namespace kvlm {

class LlamaModel;

// Convention: the stream is tokens[0, num_tokens) of the tokenized text (BOS first), fed in
// order into one sequence that is never reset. The logits row at position p predicts token
// p + 1, so every token after the first is scored: num_tokens - 1 predictions. Segment k holds
// the predictions made at positions [k * segment, min((k + 1) * segment, num_tokens - 1)): with
// segment == trained context, segment 0 is exactly the in-context part.
struct StreamOptions {
  int64_t num_tokens = 0;   // stream length, BOS included; 0 = every token given
  int segment = 512;        // predictions per segment
  int chunk = 256;          // tokens per forward; results do not depend on it beyond float noise
  int trained_ctx = 0;      // positions >= this are past the context; 0 = the GGUF's context_length
  EvalCacheOptions cache;
  EvalCacheFactory make_cache;  // empty: the full cache (pool sized for num_tokens)
  // Also score every prediction in context, as the yardstick for the stream's: the stream is cut
  // into pieces of trained_ctx / 2 positions, and each piece runs from a fresh full cache that
  // starts trained_ctx positions before the piece ends, so every prediction sees between
  // trained_ctx / 2 and trained_ctx preceding tokens (fewer only at the very start) at positions
  // inside the trained context. Costs about twice the stream's forwards, none of them long.
  bool in_context_reference = false;
};

struct StreamSegment {
  int index = 0;
  int64_t first_position = 0;  // positions of the predicting rows: [first_position, end_position)
  int64_t end_position = 0;    // the targets are the tokens at [first_position + 1, end_position + 1)
  PerplexityStats stats;       // count, mean NLL (+ stderr), PPL of this segment's predictions
  PerplexityStats reference;   // the same predictions in context (in_context_reference), else empty
  int64_t num_past_context = 0;  // predictions made at positions >= trained_ctx
  int64_t kv_cached_tokens = 0;  // slots the cache held when the segment's last row was computed
  int kv_blocks = 0;             // blocks of the live pool held then
  uint64_t kv_bytes = 0;         // kv_blocks x bytes per block
};

struct StreamResult {
  int64_t num_tokens = 0;        // stream length (BOS included)
  int trained_ctx = 0;           // the context the past-context flags refer to
  std::vector<StreamSegment> segments;
  PerplexityStats overall;       // all num_tokens - 1 predictions
  PerplexityStats in_context;    // predictions at positions < trained_ctx
  PerplexityStats past_context;  // predictions at positions >= trained_ctx (count 0 when none)
  PerplexityStats reference;     // all predictions in context (in_context_reference), else empty
  // Largest segment PPL / its reference PPL - 1 over segments (in_context_reference): how far
  // the stream ever strays from in-context quality on the same text.
  double max_segment_excess = 0;
  uint64_t kv_bytes_per_block = 0;
  uint64_t kv_bytes_peak = 0;    // most bytes held at any moment (EvalSequenceCache::peak_blocks_held)
  int64_t kv_cached_peak = 0;    // most token slots attention saw at any moment (a SnapKV prompt step)
  double seconds = 0;
};

// Runs the stream. Errors: fewer than 2 stream tokens, a text shorter than num_tokens (naming
// both counts), segment or chunk < 1, trained_ctx < 0, tokens outside the vocabulary, and the
// cache factory's own errors (bad block size, pool too large).
Result<StreamResult> evaluate_stream(LlamaModel& model, ThreadPool& pool, std::span<const TokenId> tokens,
                                     const StreamOptions& options);

}  // namespace kvlm
