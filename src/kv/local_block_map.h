// LocalBlockMap: where the sliding-window (local) layers keep a block: a slot of their own,
// smaller arena, held while some sequence's window covers the block and kept afterwards, for a
// later prefix-cache hit, until the slot is needed for another block.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/check.h"

namespace kvlm {

// Block ids are the pool's (the global layers' arena index); a local slot is an index into each
// local layer's arena. One map serves every local layer, as one block table serves every layer.
//
// A slot is in one of three states:
//   free      mapped to no block;
//   pinned    mapped, and at least one sequence's window covers its block (pins() > 0): never
//             taken away;
//   retained  mapped, no pins: its bytes still read back what was written for the block (a
//             prefix-cache hit may pin it again), but pin() of another block takes it when no
//             slot is free, the one unpinned longest ago first.
class LocalBlockMap {
 public:
  LocalBlockMap() = default;
  LocalBlockMap(int num_block_ids, int num_slots)
      : slot_of_(static_cast<size_t>(num_block_ids), -1),
        block_of_(static_cast<size_t>(num_slots), -1),
        pins_(static_cast<size_t>(num_slots), 0),
        prev_(static_cast<size_t>(num_slots), -1),
        next_(static_cast<size_t>(num_slots), -1),
        num_slots_(num_slots) {
    free_.reserve(static_cast<size_t>(num_slots));
    for (int s = num_slots - 1; s >= 0; --s) free_.push_back(s);  // slot 0 handed out first
  }

  // One more pin on the block's slot, mapping it to a free slot (else the least recently
  // retained one) when it has none. False, changing nothing, when every slot is pinned.
  // `reclaimed` gets the block whose retained slot was taken, or -1.
  bool pin(int32_t block, int32_t* reclaimed = nullptr) {
    if (reclaimed != nullptr) *reclaimed = -1;
    int32_t& slot = slot_of_[static_cast<size_t>(block)];
    if (slot < 0) {
      int32_t s = -1;
      if (!free_.empty()) {
        s = free_.back();
        free_.pop_back();
      } else if (lru_head_ >= 0) {
        s = lru_head_;
        unlink(s);
        const int32_t old = block_of_[static_cast<size_t>(s)];
        slot_of_[static_cast<size_t>(old)] = -1;
        if (reclaimed != nullptr) *reclaimed = old;
        --num_retained_;
      } else {
        return false;
      }
      slot = s;
      block_of_[static_cast<size_t>(s)] = block;
    } else if (pins_[static_cast<size_t>(slot)] == 0) {
      unlink(slot);
      --num_retained_;
    }
    if (pins_[static_cast<size_t>(slot)]++ == 0) ++num_pinned_;
    peak_pinned_ = std::max(peak_pinned_, num_pinned_);
    return true;
  }

  // One pin less; the last one makes the slot retained. A CHECK that the block is pinned.
  void unpin(int32_t block) {
    const int32_t slot = slot_of_[static_cast<size_t>(block)];
    KVLM_CHECK(slot >= 0 && pins_[static_cast<size_t>(slot)] > 0, "local block {} is not pinned", block);
    if (--pins_[static_cast<size_t>(slot)] > 0) return;
    --num_pinned_;
    ++num_retained_;
    link_tail(slot);
  }

  // Unmaps a retained block's slot (its bytes are no longer worth keeping); no-op without one.
  // A CHECK that it is not pinned.
  void free_slot(int32_t block) {
    int32_t& slot = slot_of_[static_cast<size_t>(block)];
    if (slot < 0) return;
    KVLM_CHECK(pins_[static_cast<size_t>(slot)] == 0, "local block {} is pinned {} times", block,
               pins_[static_cast<size_t>(slot)]);
    unlink(slot);
    --num_retained_;
    block_of_[static_cast<size_t>(slot)] = -1;
    free_.push_back(slot);
    slot = -1;
  }

  // The block's slot (pinned or retained), or -1 when it holds none.
  int32_t slot(int32_t block) const { return slot_of_[static_cast<size_t>(block)]; }
  int pins(int32_t block) const {
    const int32_t s = slot(block);
    return s < 0 ? 0 : pins_[static_cast<size_t>(s)];
  }

  int num_slots() const { return num_slots_; }
  int num_pinned() const { return num_pinned_; }
  int num_retained() const { return num_retained_; }
  int peak_pinned() const { return peak_pinned_; }

 private:
  // The retained slots in the order they were retained: head first to go.
  void link_tail(int32_t s) {
    prev_[static_cast<size_t>(s)] = lru_tail_;
    next_[static_cast<size_t>(s)] = -1;
    if (lru_tail_ >= 0) next_[static_cast<size_t>(lru_tail_)] = s;
    else lru_head_ = s;
    lru_tail_ = s;
  }
  void unlink(int32_t s) {
    const int32_t p = prev_[static_cast<size_t>(s)];
    const int32_t n = next_[static_cast<size_t>(s)];
    if (p >= 0) next_[static_cast<size_t>(p)] = n;
    else lru_head_ = n;
    if (n >= 0) prev_[static_cast<size_t>(n)] = p;
    else lru_tail_ = p;
    prev_[static_cast<size_t>(s)] = next_[static_cast<size_t>(s)] = -1;
  }

  std::vector<int32_t> slot_of_;   // [num_block_ids] slot or -1
  std::vector<int32_t> block_of_;  // [num_slots] block or -1
  std::vector<int32_t> pins_;      // [num_slots]
  std::vector<int32_t> prev_;      // [num_slots] retained list links
  std::vector<int32_t> next_;
  std::vector<int32_t> free_;  // slots no block holds
  int32_t lru_head_ = -1;
  int32_t lru_tail_ = -1;
  int num_slots_ = 0;
  int num_pinned_ = 0;
  int num_retained_ = 0;
  int peak_pinned_ = 0;
};

}  // namespace kvlm
