// EngineRequest: one request's state inside the Engine (known tokens, its sequence, its output).
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "cache/block_hash.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "engine/stop_matcher.h"
#include "evict/evicting_sequence.h"
#include "model/incremental_detokenizer.h"
#include "model/llama_model.h"

namespace kvlm {

struct EngineRequest {
  using Clock = std::chrono::steady_clock;

  RequestId id;
  RequestOptions options;
  TokenCallback on_event;

  // Known tokens (prompt + generated) and how many of them the cache holds: scheduling makes
  // num_computed catch up to tokens.size(); when it does, the next token is sampled.
  std::vector<TokenId> tokens;
  int num_prompt = 0;
  int num_computed = 0;
  int num_generated = 0;
  int limit = 0;              // tokens.size() at which generation ends with kLength
  int high_water = 0;         // most tokens ever computed: recomputed rows are not captured again
  std::unique_ptr<EvictingSequence> sequence;  // while running
  uint64_t admission = 0;     // order of its latest admission
  bool admitted_before = false;

  // Under an eviction policy the cache depends on how the tokens were split into forwards, so
  // a preempted request replays the same steps when it recomputes.
  std::vector<int> step_sizes;
  size_t replay_next = 0;
  bool replaying = false;

  // Prefix caching: the chain root (identity + salt), the hashes of its full blocks so far, and
  // how many of its table's leading blocks are published (or were found published).
  BlockHash root;
  std::vector<BlockHash> block_hashes;
  int num_published = 0;

  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<IncrementalDetokenizer> detokenizer;
  std::unique_ptr<StopMatcher> stop;
  std::vector<float> captured_logits;

  // This step's plan.
  SequenceStep step;
  int planned = 0;
  bool done = false;

  Clock::time_point submitted_at;
  Clock::time_point last_token_at;
  RequestStats stats;
};

}  // namespace kvlm
