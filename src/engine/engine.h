// Engine: many requests in one KV pool — continuous batching, prefix caching, preemption.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <string>
#include <vector>

#include "cache/kv_cache_manager.h"
#include "core/fault_injection.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "engine/engine_metrics.h"
#include "engine/request.h"
#include "kv/kv_storage.h"
#include "kv/kv_type.h"

namespace kvlm {

class LlamaModel;
struct EngineRequest;
struct ModelConfig;

// Window and StreamingLLM keep one contiguous window, so every query stays within the budget of
// its keys and a request may run past the model's context; H2O and SnapKV keep old tokens at
// their text positions, so the context still bounds them.
bool window_policy(EvictionPolicy policy);
// The length a request's tokens may reach (prompt + new): prompt + max_tokens, or the context
// when max_tokens is 0, capped by the context unless window_policy.
int request_token_limit(const ModelConfig& config, int num_prompt, int max_tokens, EvictionPolicy policy);

struct EngineOptions {
  // The pool: one KV codec for every request (it is a property of the blocks' bytes).
  KvType k_type = KvType::kF16;
  KvType v_type = KvType::kF16;
  KvStorageOptions storage;
  int block_size = 16;
  int num_blocks = 0;            // blocks in the pool (each addresses every layer)
  int max_batch_tokens = 512;    // tokens per step (decode tokens + prompt chunks)
  int max_seqs = 64;             // requests running at once
  bool prefix_caching = true;
  // Tests only: makes chosen block allocations or forwards fail (core/fault_injection.h). Null
  // in production.
  std::shared_ptr<FaultInjection> faults;
};

// Scheduling (vLLM v1's one invariant): every request's computed tokens catch up to its known
// tokens (prompt + generated). Each step fills a token budget: running requests first, in
// priority then admission order (decode tokens, then unfinished prompt chunks), then waiting
// ones, admitted only while their next chunk's blocks fit. There are no prefill/decode modes: a
// long prompt advances a chunk per step beside the decodes. When a running request cannot get
// a block, the lowest-priority, most recently admitted running request is preempted: its blocks
// go back (published ones stay findable, so it usually resumes from the prefix cache) and it
// returns to the front of the waiting queue; it later produces exactly what it would have. A
// failed block allocation is answered the same way, whatever its cause. A forward that runs out
// of host memory (std::bad_alloc) ends the requests of that step with kError; the engine and
// every other request carry on.
//
// Threads: submit, cancel and metrics may be called from any thread, callbacks included. step()
// runs on one thread at a time (the caller's, or the engine's own after start()); callbacks run
// on it and must not call step().
class Engine {
 public:
  static Result<std::unique_ptr<Engine>> create(LlamaModel& model, ThreadPool& pool, const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates the request and queues it. Errors (nothing queued): an empty prompt, tokens
  // outside the vocabulary, a prompt beyond the model's context (without a window policy),
  // bad sampling or eviction options, a request that could never fit the pool even alone.
  Result<RequestId> submit(RequestOptions request, TokenCallback on_event);
  // Ends a request at any time; its last event says kCancelled. False when it is unknown or
  // already finished.
  bool cancel(RequestId id);

  // One batched forward over the scheduled tokens. False when there was nothing to do.
  bool step();
  // Steps until no request is waiting or running.
  void run_until_idle();
  // A thread of the engine's own steps whenever there is work; stop() joins it (requests
  // still in flight are cancelled).
  void start();
  void stop();

  EngineMetrics metrics() const;
  const EngineOptions& options() const { return options_; }
  const KvStorage& storage() const { return *storage_; }
  // Sliding-window layers that keep only windows get slots for max_seqs + this many sequences:
  // a compaction pins its destinations before its sources go, and the spare slots keep finished
  // windows for prefix hits.
  static constexpr int kLocalSpareSequences = 1;
  // What the engine changed from its options, for the user. Callers print them.
  const std::vector<std::string>& warnings() const { return warnings_; }
  const KvCacheManager& cache() const { return cache_; }
  LlamaModel& model() { return model_; }
  // The blocks a request of `total_tokens` (prompt + output) needs under `eviction`.
  int blocks_for_request(const EvictionOptions& eviction, int64_t total_tokens) const;
  // Every block free or cached-free with ref count 0 when no request is in flight: the count
  // of blocks held by nobody's request that are not back (must be 0). Safe from any thread
  // while the engine runs: it waits for the step in progress.
  int leaked_blocks() const;

 private:
  Engine(LlamaModel& model, ThreadPool& pool, const EngineOptions& options, std::unique_ptr<KvStorage> storage);

  void take_submissions();           // moves new requests and cancellations in (under mutex_)
  void schedule_and_run();
  void admit(EngineRequest& request);  // starts its sequence and attaches its prefix hit
  void preempt(EngineRequest& request);
  void finish(EngineRequest& request, FinishReason reason, std::string error = {});
  void release(EngineRequest& request);  // gives its sequence's blocks back
  void publish_full_blocks(EngineRequest& request);
  // How many leading blocks of a prefix hit are usable: all of them, or (sliding-window layers
  // that keep only windows) the longest run whose last window still holds its local-layer bytes.
  int local_window_cached(std::span<const BlockId> hits) const;
  // Books a step's tokens; true when the request has caught up and its last row is to be sampled.
  bool after_forward(EngineRequest& request, int taken, const float* logits, int num_rows);
  // Draws the next token of every request caught up in this step, over the pool (each request's
  // sampler is its own), then takes them in order: stop checks, streaming, finishing.
  struct SampleJob {
    EngineRequest* request = nullptr;
    std::span<const float> logits;  // its last row
    TokenId token = -1;             // -1: the draw ran out of memory
  };
  void sample_and_take(std::vector<SampleJob>& jobs);
  void take_token(EngineRequest& request, TokenId next);
  void emit_token(EngineRequest& request, TokenId token, std::string text);
  void note_usage();
  // The batched forward; false when it ran out of memory (the step's requests then ended).
  bool run_forward(const std::vector<EngineRequest*>& planned);

  LlamaModel& model_;
  ThreadPool& pool_;
  EngineOptions options_;
  std::unique_ptr<KvStorage> storage_;
  KvCacheManager cache_;
  std::string cache_identity_;

  // Owned by the stepping thread. step_mutex_ is held through each step (and stop()'s clean-up),
  // so another thread may read this state and the cache between steps (leaked_blocks()).
  mutable std::mutex step_mutex_;
  std::vector<std::unique_ptr<EngineRequest>> running_;  // admission order
  std::deque<std::unique_ptr<EngineRequest>> waiting_;   // preempted ones at the front
  uint64_t next_admission_ = 0;
  std::vector<float> logits_;

  // Shared with submitters (mutex_).
  mutable std::mutex mutex_;
  std::condition_variable work_;
  std::vector<std::unique_ptr<EngineRequest>> submitted_;
  std::vector<RequestId> cancelled_;
  std::unordered_set<int32_t> in_flight_;  // ids of requests still running or waiting
  int32_t next_request_id_ = 0;
  EngineMetrics metrics_;  // counters updated under mutex_; gauges refreshed after each step
  std::thread thread_;
  bool stopping_ = false;
  std::atomic<bool> stepping_{false};
  std::vector<std::string> warnings_;
};

}  // namespace kvlm
