#include "kv/local_window_hold.h"

#include <algorithm>

#include "core/check.h"

namespace kvlm {
namespace {

BlockId entry(std::span<const int32_t> table, int index) { return BlockId(table[static_cast<size_t>(index)]); }

// Pins entries [first, end) of the table; on failure unpins the ones it pinned.
bool pin_range(KvStorage& storage, std::span<const int32_t> table, int first, int end) {
  for (int i = first; i < end; ++i) {
    if (storage.pin_local_block(entry(table, i))) continue;
    for (int j = first; j < i; ++j) storage.unpin_local_block(entry(table, j));
    return false;
  }
  return true;
}

}  // namespace

bool LocalWindowHold::extend(KvStorage& storage, std::span<const int32_t> table) {
  if (!storage.has_local_layers()) return true;
  const int size = static_cast<int>(table.size());
  KVLM_CHECK(size >= end_, "local window hold: the table shrank from {} to {} entries unreported", end_, size);
  if (!pin_range(storage, table, end_, size)) return false;
  end_ = size;
  return true;
}

void LocalWindowHold::release_before(KvStorage& storage, std::span<const int32_t> table, int64_t first_needed_token) {
  if (!storage.has_local_layers()) return;
  const int64_t bs = storage.layout().block_size;
  const int new_begin = static_cast<int>(std::min<int64_t>(end_, std::max<int64_t>(0, first_needed_token) / bs));
  for (int i = begin_; i < new_begin; ++i) storage.unpin_local_block(entry(table, i));
  begin_ = std::max(begin_, new_begin);
}

void LocalWindowHold::adopt(KvStorage& storage, std::span<const int32_t> table, int first_block) {
  if (!storage.has_local_layers()) return;
  KVLM_CHECK(begin_ == end_, "local window hold: adopt on a hold that pins {} blocks", end_ - begin_);
  const int size = static_cast<int>(table.size());
  first_block = std::clamp(first_block, 0, size);
  for (int i = first_block; i < size; ++i) {
    KVLM_CHECK(storage.local_block_cached(entry(table, i)),
               "local window hold: block {} (entry {}) lost its local-layer bytes before it was adopted",
               table[static_cast<size_t>(i)], i);
    KVLM_CHECK(storage.pin_local_block(entry(table, i)), "a cached local block can always be pinned");
  }
  begin_ = first_block;
  end_ = size;
}

bool LocalWindowHold::widen(KvStorage& storage, std::span<const int32_t> table, int first_block) {
  if (!storage.has_local_layers() || first_block >= begin_) return true;
  first_block = std::max(0, first_block);
  if (!pin_range(storage, table, first_block, begin_)) return false;
  begin_ = first_block;
  return true;
}

void LocalWindowHold::drop(KvStorage& storage, std::span<const int32_t> table, int first_block, int count) {
  if (!storage.has_local_layers() || count <= 0) return;
  const int last = first_block + count;
  for (int i = std::max(first_block, begin_); i < std::min(last, end_); ++i) storage.unpin_local_block(entry(table, i));
  // Entries at or after `last` move down by count; covered ones inside the range are gone.
  auto renumber = [&](int index) { return index >= last ? index - count : std::min(index, first_block); };
  begin_ = renumber(begin_);
  end_ = renumber(end_);
}

void LocalWindowHold::truncate(KvStorage& storage, std::span<const int32_t> table, int num_blocks) {
  if (!storage.has_local_layers()) return;
  for (int i = std::max(num_blocks, begin_); i < end_; ++i) storage.unpin_local_block(entry(table, i));
  end_ = std::min(end_, num_blocks);
  begin_ = std::min(begin_, end_);
}

bool LocalWindowHold::pin_copy(KvStorage& storage, int index, BlockId copy) {
  if (!storage.has_local_layers() || !covers(index)) return true;
  return storage.pin_local_block(copy);
}

void LocalWindowHold::unpin_swapped(KvStorage& storage, int index, BlockId shared) {
  if (!storage.has_local_layers() || !covers(index)) return;
  storage.unpin_local_block(shared);
}

void LocalWindowHold::release_all(KvStorage& storage, std::span<const int32_t> table) {
  if (!storage.has_local_layers()) return;
  // First entry first: retained slots are taken back in the order they were unpinned, so the
  // blocks nearest the sequence's end (the ones a later hit's window needs) stay longest.
  for (int i = begin_; i < end_; ++i) storage.unpin_local_block(entry(table, i));
  begin_ = end_ = 0;
}

}  // namespace kvlm
