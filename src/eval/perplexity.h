// Perplexity over fixed windows (llama.cpp's perplexity-tool convention) and its pure scoring pieces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/ids.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "evict/evicting_sequence.h"
#include "evict/eviction_options.h"
#include "kv/kv_storage.h"
#include "kv/kv_type.h"

namespace kvlm {

class LlamaModel;

// Convention (the same as llama.cpp's `perplexity` tool):
//  - the whole text is tokenized once, BOS first when the tokenizer adds BOS;
//  - it is cut into consecutive, non-overlapping windows of ctx tokens; an incomplete
//    trailing window is dropped;
//  - each window's first token is replaced by BOS (when the tokenizer adds BOS) and the window
//    runs from an empty cache;
//  - with first = ctx / 2, the logits of positions j in [first, ctx - 1) predict token j + 1:
//    ctx - 1 - ctx / 2 scored tokens per window (ctx/2 - 1 for even ctx).
struct WindowPlan {
  int num_windows = 0;
  int first_scored = 0;        // ctx / 2: first logits row that is scored
  int scored_per_window = 0;   // ctx - 1 - ctx / 2
  int64_t num_scored = 0;      // num_windows * scored_per_window
};

// Windows for num_tokens tokens; max_windows > 0 caps their number (0 = all).
WindowPlan plan_windows(int64_t num_tokens, int ctx, int max_windows);

// Log-softmax of one row of logits, computed in double: out[v] = x[v] - log(sum exp x).
void log_softmax(std::span<const float> logits, std::vector<double>& out);

// Negative log-likelihoods of targets[r] under row r of logits ([rows, vocab]), appended to nll.
void score_rows(std::span<const float> logits, int vocab, std::span<const TokenId> targets,
                std::vector<double>& nll);

// Mean NLL and its spread over scored tokens.
struct PerplexityStats {
  int64_t num_scored = 0;
  double mean_nll = 0;
  double nll_stderr = 0;  // standard error of the mean: sqrt(sample variance / n)
  double ppl = 0;         // exp(mean_nll)
  double ppl_stderr = 0;  // delta method: ppl * nll_stderr
};
PerplexityStats perplexity_from_nll(std::span<const double> nll);

struct PerplexityOptions {
  int ctx = 512;
  KvType k_type = KvType::kF32;
  KvType v_type = KvType::kF32;
  KvStorageOptions storage;  // the KIVI residual window
  int block_size = 16;
  int max_windows = 0;     // 0 = every complete window
  int prefill_chunk = 512; // tokens per forward; results do not depend on it beyond float noise
  // With a policy, each window runs through an EvictingSequence: its unscored first half is fed
  // as one prompt, then the scored half; the policy keeps at most its budget throughout (SnapKV:
  // the prompt runs whole and is compressed to the budget before the scored half).
  EvictionOptions eviction;
};

struct PerplexityResult {
  PerplexityStats stats;
  WindowPlan plan;
  int64_t num_text_tokens = 0;
  uint64_t kv_bytes_per_token = 0;   // the formula's bytes per token (all layers, K + V)
  uint64_t kv_bytes_formula = 0;     // kv_bytes_per_token * ctx
  uint64_t kv_bytes_peak = 0;        // peak blocks in use x bytes per block, from the live pool
  uint64_t kv_staging_bytes_peak = 0;  // KIVI: peak f32 staging (tail + residual blocks) beside the blocks
  int kv_blocks_peak = 0;
  int kv_local_blocks_peak = 0;      // most sliding-window layer slots held at once
  EvictionStats eviction;            // summed over the windows (zero without a policy)
  double seconds = 0;
};

// Called once per scored token, in order, with the row's log-probabilities ([vocab], double)
// and the token that follows; an error stops the run and is returned.
using ScoredTokenFn = std::function<Status(std::span<const double> log_probs, TokenId target)>;

// Runs the windows over `tokens` (the whole tokenized text). Errors: ctx < 8 or above the
// model's context, a text shorter than one window, bad block or chunk sizes.
Result<PerplexityResult> evaluate_perplexity(LlamaModel& model, ThreadPool& pool, std::span<const TokenId> tokens,
                                             const PerplexityOptions& options, const ScoredTokenFn& on_scored = {});

}  // namespace kvlm
