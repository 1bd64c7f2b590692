// BlockPool: KV block ids with reference counts and a free queue; bookkeeping only, no KV bytes.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/fault_injection.h"
#include "core/ids.h"

namespace kvlm {

// Free queue order: a FIFO. Blocks start free in id order 0, 1, 2, …; allocate()
// takes the block at the front, and a block whose ref count drops to 0 joins the
// back. So the block freed longest ago is reused first, and recently freed
// blocks stay intact longest: the prefix cache can revive them (take_free), and
// taking from the front is then least-recently-used eviction.
// The queue is an intrusive doubly linked list over the block ids, so
// allocate/release never allocate memory and take_free takes a block out of the
// middle of the queue in O(1) (prefix-cache hit on a free block); the order of
// the blocks left is unchanged.
class BlockPool {
 public:
  // faults (tests only, not owned, may be null): FaultInjection::Site::kBlockAllocation makes a
  // chosen allocate() answer nullopt although blocks are free, so every caller's "no room" path
  // runs, not only the ones a full pool reaches.
  explicit BlockPool(int num_blocks, FaultInjection* faults = nullptr);

  // A block with ref count 1, or nullopt when no block is free (or a fault is injected). Never throws.
  std::optional<BlockId> allocate();
  // Adds a reference to a block in use (sharing it with another sequence).
  void acquire(BlockId block);
  // Drops a reference; at 0 the block goes to the back of the free queue.
  void release(BlockId block);
  // Takes a free block (ref count 0, a CHECK) out of the queue wherever it is and
  // gives it ref count 1: a prefix-cache hit on a block whose bytes are still intact.
  void take_free(BlockId block);

  int ref_count(BlockId block) const;
  bool is_free(BlockId block) const { return ref_count(block) == 0; }
  int num_free() const { return num_free_; }
  int num_blocks() const { return static_cast<int>(ref_counts_.size()); }

  // The free queue front to back (the order allocate() will hand blocks out); for tests and debugging.
  std::vector<BlockId> free_queue() const;

 private:
  static constexpr int32_t kNone = -1;

  void check_id(BlockId block) const;
  void push_back_free(int32_t id);
  int32_t pop_front_free();
  void unlink_free(int32_t id);

  std::vector<int32_t> ref_counts_;  // [num_blocks]; 0 = in the free queue
  std::vector<int32_t> prev_free_;   // [num_blocks]; links of the free queue, kNone at the ends
  std::vector<int32_t> next_free_;   // [num_blocks]
  int32_t free_head_ = kNone;
  int32_t free_tail_ = kNone;
  int num_free_ = 0;
  FaultInjection* faults_ = nullptr;
};

}  // namespace kvlm
