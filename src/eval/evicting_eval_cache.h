// make_evicting_eval_cache: the EvalSequenceCache of a sequence that runs under an eviction policy.
#pragma once

#include "eval/eval_sequence_cache.h"
#include "evict/eviction_options.h"

namespace kvlm {

// A factory for evaluate_stream / run_recall_probe: the sequence keeps at most the policy's
// budget (EvictingSequence), so the pool is sized for the budget, not the stream, and memory
// stays flat however long the stream runs. kNone gives the full cache. Invalid options are
// reported when the factory is called.
EvalCacheFactory make_evicting_eval_cache(const EvictionOptions& eviction);

}  // namespace kvlm
