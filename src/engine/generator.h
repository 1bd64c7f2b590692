// Generator: runs one sequence through prefill and decode over the paged KV cache, with statistics.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/ids.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "engine/sampler.h"
#include "evict/evicting_sequence.h"
#include "evict/eviction_options.h"
#include "kv/kv_storage.h"
#include "kv/kv_type.h"

namespace kvlm {

class LlamaModel;

struct GenerationOptions {
  // New tokens to generate (llama2.c's -n when the prompt is BOS alone); generation also
  // stops at EOS or when the context is full. 0: until EOS or the context is full.
  int max_tokens = 256;
  SamplerParams sampler;
  KvType k_type = KvType::kF32;
  KvType v_type = KvType::kF32;
  KvStorageOptions storage;      // the KIVI residual window
  int block_size = 16;
  int prefill_chunk = 256;       // prompt tokens per forward step (bounds scratch memory)
  bool stop_at_eos = true;       // EOS, or BOS appearing mid-stream (llama2.c's delimiter), ends generation
  bool verify = false;           // compare every step's logits with the no-cache reference forward
  // Token eviction. With window or streaming, generation may run past the model's context:
  // memory stays at the budget and no query is ever farther than the budget from a key
  // (streaming's sinks are scored at positions within the cache).
  EvictionOptions eviction;
};

struct GenerationStats {
  int prompt_tokens = 0;
  int generated_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
  // K/V projections (per layer) computed with the cache, vs what recomputing the whole
  // context at every step would have computed.
  uint64_t kv_projections_cached = 0;
  uint64_t kv_projections_recompute = 0;
  uint64_t kv_bytes_per_token = 0;    // by formula: 2 x layers x kv_heads x head_dim x bytes
  uint64_t kv_bytes_allocated = 0;    // peak bytes of the blocks this sequence held
  uint64_t kv_staging_bytes_peak = 0; // KIVI: peak f32 staging (tail + residual blocks) beside the blocks
  uint64_t kv_pool_bytes = 0;         // the whole arena reserved for the run
  int kv_blocks_peak = 0;
  int kv_local_blocks_peak = 0;       // most local-layer slots held at once (sliding-window models)
  int kv_tokens_cached = 0;           // tokens whose K/V the cache held at the end (attention's view)
  EvictionStats eviction;             // what the policy evicted, moved and copied
  int block_size = 0;
  int blocks_leaked = 0;              // blocks not back in the pool after the sequence ended (must be 0)
  bool verified = false;
  double verify_max_rel_error = 0;    // max over steps of max|cached - reference| / max|reference|
  int threads = 0;

  double prefill_tokens_per_second() const;
  double decode_tokens_per_second() const;
};

struct GenerationResult {
  std::vector<TokenId> tokens;  // prompt + generated
  std::string text;             // decoded, prompt included
  GenerationStats stats;
};

class Generator {
 public:
  Generator(LlamaModel& model, ThreadPool& pool) : model_(model), pool_(pool) {}

  // Called with the text each new token adds (prompt text first, in one call).
  using TextCallback = std::function<void(std::string_view)>;

  // Errors: empty prompt, prompt beyond the context, bad options, no room in the pool.
  Result<GenerationResult> generate(const std::vector<TokenId>& prompt, const GenerationOptions& options,
                                    const TextCallback& on_text);

 private:
  LlamaModel& model_;
  ThreadPool& pool_;
};

}  // namespace kvlm
