// EvalSequenceCache: the KV cache one evaluated sequence runs through; the seam where eviction policies plug in.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "core/ids.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "kv/kv_storage.h"
#include "kv/kv_type.h"
#include "model/llama_model.h"

namespace kvlm {

// How the cache stores K/V: the same choices `eval ppl` offers.
struct EvalCacheOptions {
  KvType k_type = KvType::kF32;
  KvType v_type = KvType::kF32;
  KvStorageOptions storage;  // the KIVI residual window
  int block_size = 16;
};

// The stream and recall evaluations feed one sequence's tokens chunk by chunk and read logits
// back; they never touch blocks themselves. Everything about what the cache keeps lives behind
// this interface, so an evicting cache (issue 5: window, StreamingLLM, H2O, SnapKV) is one more
// implementation: its forward() asks its policy which slots to drop once the budget is reached,
// compacts the survivors, and runs the model with positions of its choosing (StreamingLLM's
// positions within the cache). The evaluations stay unchanged; only the factory differs.
//
// The stream position (num_fed) counts every token fed since the last reset, whatever the cache
// still holds: it is what the evaluations index their text and segments by.
class EvalSequenceCache {
 public:
  virtual ~EvalSequenceCache() = default;

  // Feeds `tokens` after every token fed so far and returns their logits ([rows, vocab]:
  // one row per token for kAll, the last token's for kLast).
  virtual void forward(std::span<const TokenId> tokens, LogitsRows rows, std::vector<float>& logits) = 0;
  // Drops the sequence: the next forward starts from an empty cache at position 0.
  virtual void reset() = 0;

  virtual int64_t num_fed() const = 0;          // tokens fed since the last reset
  virtual int64_t num_cached() const = 0;       // token slots the cache holds now
  virtual int num_blocks_held() const = 0;      // blocks in use in the live pool now
  virtual uint64_t bytes_per_block() const = 0; // K + V bytes of one block over all layers
  // The most blocks held at any moment since the cache was made, also inside a forward (SnapKV
  // holds a whole prompt step before it compresses); at least num_blocks_held().
  virtual int peak_blocks_held() const { return num_blocks_held(); }
  // The most token slots attention saw at any moment since the cache was made; at least num_cached().
  virtual int64_t peak_cached() const { return num_cached(); }
  uint64_t bytes_held() const { return static_cast<uint64_t>(num_blocks_held()) * bytes_per_block(); }
};

// What an evaluation knows about its run when it asks for a cache: the pool is sized from it.
struct EvalCacheRequest {
  EvalCacheOptions options;
  int64_t max_tokens = 0;  // most tokens one sequence is fed before a reset
};

// Makes the cache for a run. An empty factory in an evaluation's options means the full cache.
using EvalCacheFactory = std::function<Result<std::unique_ptr<EvalSequenceCache>>(
    LlamaModel& model, ThreadPool& pool, const EvalCacheRequest& request)>;

// The full cache: keeps every token; its pool holds max_tokens tokens, so memory grows with the
// sequence and attention costs O(tokens) per token. Errors for bad block sizes or when the pool
// cannot be allocated.
Result<std::unique_ptr<EvalSequenceCache>> make_full_eval_cache(LlamaModel& model, ThreadPool& pool,
                                                                const EvalCacheRequest& request);

// The factory's cache, or the full cache when the factory is empty.
Result<std::unique_ptr<EvalSequenceCache>> make_eval_cache(const EvalCacheFactory& factory, LlamaModel& model,
                                                           ThreadPool& pool, const EvalCacheRequest& request);

}  // namespace kvlm
