// attention_weights: the softmax weights that queries give each cached token, summed (for H2O and SnapKV).
#pragma once

#include <span>

#include "attention/paged_attention.h"
#include "core/thread_pool.h"

namespace kvlm {

// For each context token t in [0, args.num_context_tokens), adds to token_weights[t] the
// sum, over the args' queries and all their query heads, of the softmax weight that
// (query, head) gives token t: exactly the weights paged_attention(args) uses, with the
// same visibility (causal, sinks, window; sinks scored with q_sink when given) and, over
// int8 and int4 keys, the same rounded queries (query_rounding.h). Tokens no
// query sees get nothing added and are never read. Each (query, head) row sums to 1, so
// one call adds num_queries × num_heads in total. args.out is not used (may be null).
//
// The engine gets these sums from the kernels themselves (PagedAttentionArgs::token_weights),
// which emit the scores as they attend. This separate pass is their independent check and a
// portable fallback: it reads K of every
// visible token once more, decoded through the codec (or taken from the KIVI staging
// rows) into an f32 scratch copy of the sequence's visible keys for this layer
// (num_kv_heads × num_context_tokens × head_dim floats, rounded up to 16 tokens), so it
// costs one more read and decode of K, that memory, and the scores, on top of the
// attention itself. Portable code: scores and exponentials in f32, each row's max taken
// first and its sum of exponentials and the per-token sums kept in double. The split
// across tasks depends on the shapes only and the partial sums are added in a fixed
// order, so results are bitwise the same for any number of threads.
//   token_weights: [>= num_context_tokens]
// Arguments are checked (KVLM_CHECK) as paged_attention checks them. Uses `pool`, so it
// must not be called from inside a task of the same pool.
void accumulate_attention_weights(const PagedAttentionArgs& args, std::span<float> token_weights, ThreadPool& pool);

}  // namespace kvlm
