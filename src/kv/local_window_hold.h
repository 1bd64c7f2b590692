// LocalWindowHold: the local-layer pins of one sequence: the blocks its sliding window covers.
#pragma once

#include <cstdint>
#include <span>

#include "core/ids.h"
#include "kv/kv_storage.h"

namespace kvlm {

// A sequence's window covers a suffix of its block table: entries [begin, end) are pinned in
// the storage's local layers (KvStorage::pin_local_block), everything before `begin` is outside
// every window its later queries will have. The owner of the sequence reports each change to
// its table here, in table indices, before or after it as each function says; all of them are
// no-ops on a storage without local layers. The hold does not own the table: it is told it.
class LocalWindowHold {
 public:
  // Pins the entries appended to the table since the last call ([end, table.size())): call it
  // after reserving blocks and before writing them. False, pinning nothing, when the local
  // slots ran out (the caller makes room, like a failed reserve).
  [[nodiscard]] bool extend(KvStorage& storage, std::span<const int32_t> table);
  // The tokens before first_needed_token are outside every later window: entries wholly before
  // it are unpinned.
  void release_before(KvStorage& storage, std::span<const int32_t> table, int64_t first_needed_token);
  // Starts the hold over entries [first_block, table.size()) of a table that already holds
  // blocks (a prefix-cache hit, a fork); every one of them must be cached (a CHECK).
  void adopt(KvStorage& storage, std::span<const int32_t> table, int first_block);
  // Before compaction writes tokens into entries from first_block on: pins the entries in
  // [first_block, begin). False, pinning nothing, when the slots ran out.
  [[nodiscard]] bool widen(KvStorage& storage, std::span<const int32_t> table, int first_block);
  // Before the table drops entries [first_block, first_block + count) (token eviction): unpins
  // those the hold covers and renumbers.
  void drop(KvStorage& storage, std::span<const int32_t> table, int first_block, int count);
  // Before the table is cut to num_blocks entries: unpins the ones past it.
  void truncate(KvStorage& storage, std::span<const int32_t> table, int num_blocks);
  // Entry `index` was swapped from `shared` to its private copy `copy` (copy on write): the
  // copy is pinned before the caller copies the bytes, the shared block unpinned after
  // (unpin_swapped). False when the slots ran out: nothing changed.
  [[nodiscard]] bool pin_copy(KvStorage& storage, int index, BlockId copy);
  void unpin_swapped(KvStorage& storage, int index, BlockId shared);
  // Unpins everything (the sequence ends).
  void release_all(KvStorage& storage, std::span<const int32_t> table);

  int begin() const { return begin_; }
  int end() const { return end_; }
  bool covers(int index) const { return index >= begin_ && index < end_; }

 private:
  int begin_ = 0;
  int end_ = 0;
};

}  // namespace kvlm
