// KvCacheManager: the cache facade: sequences, their block tables and the shared block pool.
#pragma once

#include <optional>
#include <unordered_map>
#include <vector>

#include "cache/block_pool.h"
#include "cache/block_table.h"
#include "core/ids.h"
#include "core/status.h"

namespace kvlm {

// A shared block swapped for a private copy in one sequence's table (make_block_exclusive):
// the caller copies the bytes, storage.copy_block(shared, copy), before writing to `copy`.
struct BlockSwap {
  BlockId shared;  // still referenced by the other sequences that share it
  BlockId copy;    // newly allocated, ref count 1, now in the table in place of `shared`
};

// Bookkeeping only: it hands out block ids, never touches KV bytes. One block
// table per sequence addresses all layers.
//
// Per step, for each scheduled sequence: reserve(seq, n) (may fail: no room, the
// caller preempts or waits), write the K/V of tokens [num_tokens, num_tokens + n)
// at table(seq).slot(i), run attention, then append(seq, n).
class KvCacheManager {
 public:
  KvCacheManager(int num_blocks, int block_size);

  // A new, empty sequence. Ids are never reused, so a stale id is caught by CHECKs.
  SeqId create_sequence();
  // Makes room for num_new_tokens more tokens: allocates the blocks needed so the
  // sequence can hold num_tokens + num_new_tokens. Returns false, changing
  // nothing, when the pool does not have enough free blocks.
  [[nodiscard]] bool reserve(SeqId seq, int num_new_tokens);
  // Marks num_new_tokens more tokens as cached; they must have been reserved.
  void append(SeqId seq, int num_new_tokens);
  const BlockTable& table(SeqId seq) const;
  // Releases all blocks of the sequence (last block first: see free_sequence in
  // the .cc for why) and forgets the sequence.
  void free_sequence(SeqId seq);


  // Token eviction and sharing. Blocks may be shared between sequences (fork_sequence);
  // each table holds one reference on every id in it. A block whose last reference goes
  // away returns to the pool; the functions that can do that return those ids, so the
  // caller can tell the storage (storage.release_blocks(ids): KIVI staging buffers).
  // free_sequence does not return them: release_sequence() (engine/) hands the whole
  // table to the storage first instead.

  // Removes the whole blocks at table indices [first_block_idx, first_block_idx + count),
  // releases this sequence's reference on each (last one first, as free_sequence does) and
  // lowers num_tokens by count × block_size: the tokens after them move down by that much.
  // Only full blocks may go (a CHECK): first_block_idx + count <= num_tokens / block_size.
  // Returns the ids whose ref count reached 0, in release order.
  std::vector<BlockId> drop_blocks(SeqId seq, int first_block_idx, int count);
  // Shortens the sequence to its first num_tokens tokens (<= num_tokens now, a CHECK) and
  // releases the blocks past blocks_for_tokens(num_tokens), last block first; reserved
  // blocks past the old token count go too. Returns the ids whose ref count reached 0.
  std::vector<BlockId> truncate(SeqId seq, int num_tokens);
  // A new sequence with the same block ids (one more reference on each) and token count
  // as `src`. The blocks are shared: write to one of them only after make_block_exclusive.
  SeqId fork_sequence(SeqId src);
  // References on the block at table index block_idx of the sequence (1 = exclusive).
  int block_ref_count(SeqId seq, int block_idx) const;
  // Before writing into the block at block_idx: when other sequences share it, allocates a
  // block, puts it in the table in its place, releases this sequence's reference on the
  // shared one and returns both ids; the caller must then copy the KV bytes
  // (storage.copy_block(swap.shared, swap.copy)). nullopt when the block is already
  // exclusive (nothing to do). An error, changing nothing, when the pool has no free block:
  // the caller preempts or skips the eviction, as for a failed reserve.
  Result<std::optional<BlockSwap>> make_block_exclusive(SeqId seq, int block_idx);

  // Blocks needed to hold num_tokens tokens.
  int blocks_for_tokens(int num_tokens) const { return (num_tokens + block_size_ - 1) / block_size_; }

  int num_free_blocks() const { return pool_.num_free(); }
  int num_used_blocks() const { return pool_.num_blocks() - pool_.num_free(); }
  int num_blocks() const { return pool_.num_blocks(); }
  int num_sequences() const { return static_cast<int>(tables_.size()); }
  int block_size() const { return block_size_; }
  const BlockPool& pool() const { return pool_; }

 private:
  BlockTable& mutable_table(SeqId seq);
  // Releases one reference on `block`, adding it to `freed` when that was the last one.
  void release_into(BlockId block, std::vector<BlockId>& freed);

  int block_size_;
  BlockPool pool_;
  std::unordered_map<SeqId, BlockTable> tables_;
  int32_t next_seq_id_ = 0;
};

}  // namespace kvlm
