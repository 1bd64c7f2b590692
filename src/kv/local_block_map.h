// LocalBlockMap: where the sliding-window (local) layers keep a block: a slot of their own,
// smaller arena, taken when the block is first written and given back once every query that
// could see it has run.
#pragma once

#include <cstdint>
#include <vector>

#include "core/check.h"

namespace kvlm {

// Block ids are the pool's (the global layers' arena index); a local slot is an index into each
// local layer's arena. One map serves every local layer, as one block table serves every layer.
class LocalBlockMap {
 public:
  LocalBlockMap() = default;
  LocalBlockMap(int num_block_ids, int num_slots) : slot_of_(static_cast<size_t>(num_block_ids), -1) {
    free_.reserve(static_cast<size_t>(num_slots));
    for (int s = num_slots - 1; s >= 0; --s) free_.push_back(s);  // slot 0 handed out first
    num_slots_ = num_slots;
  }

  // The block's slot, taken from the free list on first use.
  int32_t assign(int32_t block) {
    int32_t& slot = slot_of_[static_cast<size_t>(block)];
    if (slot >= 0) return slot;
    KVLM_CHECK(!free_.empty(),
               "the sliding-window layers' {} block slots are all in use: the storage was sized for fewer "
               "sequences or longer steps than are running",
               num_slots_);
    slot = free_.back();
    free_.pop_back();
    peak_in_use_ = std::max(peak_in_use_, in_use());
    return slot;
  }
  // The block's slot, or -1 when it holds none.
  int32_t slot(int32_t block) const { return slot_of_[static_cast<size_t>(block)]; }
  // Gives the block's slot back (no-op when it holds none).
  void release(int32_t block) {
    int32_t& slot = slot_of_[static_cast<size_t>(block)];
    if (slot < 0) return;
    free_.push_back(slot);
    slot = -1;
  }

  int num_slots() const { return num_slots_; }
  int in_use() const { return num_slots_ - static_cast<int>(free_.size()); }
  int peak_in_use() const { return peak_in_use_; }

 private:
  std::vector<int32_t> slot_of_;  // [num_block_ids] slot or -1
  std::vector<int32_t> free_;     // slots no block holds
  int num_slots_ = 0;
  int peak_in_use_ = 0;
};

}  // namespace kvlm
