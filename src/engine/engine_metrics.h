// EngineMetrics: the engine's counters and gauges, read as one consistent snapshot.
#pragma once

#include <cstdint>

namespace kvlm {

struct EngineMetrics {
  // Gauges (now).
  int requests_running = 0;
  int requests_waiting = 0;
  int blocks_total = 0;
  int blocks_used = 0;         // ref count > 0
  int blocks_cached_free = 0;  // ref count 0, still published: reusable by a prefix hit
  int blocks_free = 0;         // ref count 0, not published
  uint64_t bytes_per_block = 0;
  uint64_t staging_bytes = 0;  // KIVI f32 staging beside the blocks
  int peak_blocks_used = 0;
  // Sliding-window layers that keep only windows (0 slots: none): their own slots by state.
  int local_slots_total = 0;
  int local_slots_pinned = 0;    // inside some running sequence's window
  int local_slots_retained = 0;  // kept for a prefix hit until another block needs the slot
  uint64_t local_bytes_per_slot = 0;
  uint64_t peak_staging_bytes = 0;  // most staging held right after a forward
  // Counters (since the engine started).
  int64_t requests_submitted = 0;
  int64_t requests_finished = 0;  // stop or length
  int64_t requests_cancelled = 0;
  int64_t requests_rejected = 0;  // at submission
  int64_t requests_failed = 0;    // kError after admission
  int64_t preemptions = 0;
  int64_t prefix_queries_tokens = 0;  // prompt tokens looked up in the prefix cache
  int64_t prefix_hit_tokens = 0;      // of those, the tokens it supplied
  int64_t blocks_published = 0;
  int64_t blocks_evicted = 0;         // cached-free blocks reused for other content
  int64_t tokens_prompted = 0;        // prompt tokens submitted
  int64_t tokens_computed = 0;        // tokens run through the model (prefill + decode + recompute)
  int64_t tokens_generated = 0;
  int64_t steps = 0;                  // batched forwards
};

}  // namespace kvlm
