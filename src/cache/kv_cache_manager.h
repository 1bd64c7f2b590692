// KvCacheManager: the cache facade: sequences, their block tables and the shared block pool.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "cache/block_hash.h"
#include "cache/block_pool.h"
#include "cache/block_table.h"
#include "cache/prefix_cache.h"
#include "core/ids.h"
#include "core/status.h"

namespace kvlm {

// A shared block swapped for a private copy in one sequence's table (make_block_exclusive):
// the caller copies the bytes, storage.copy_block(shared, copy), before writing to `copy`.
struct BlockSwap {
  BlockId shared;  // still referenced by the other sequences that share it
  BlockId copy;    // newly allocated, ref count 1, now in the table in place of `shared`
};

// Counters of the prefix cache's traffic since construction.
struct PrefixCacheStats {
  int64_t blocks_published = 0;    // publish_block calls that registered a block
  int64_t prefix_hit_blocks = 0;   // blocks attach_prefix handed to a new sequence
  int64_t blocks_evicted = 0;      // cached-free blocks reallocated for new content
  int64_t blocks_unpublished = 0;  // published blocks withdrawn before a write (exclusive, so no copy)
};

// Bookkeeping only: it hands out block ids, never touches KV bytes. One block
// table per sequence addresses all layers.
//
// Per step, for each scheduled sequence: reserve(seq, n) (may fail: no room, the
// caller preempts or waits), write the K/V of tokens [num_tokens, num_tokens + n)
// at table(seq).slot(i), run attention, then append(seq, n).
//
// Automatic prefix caching: a block's life cycle.
//   free         ref 0, not published: in the free queue, its bytes are garbage.
//   owned        allocated to one sequence (ref 1) and being filled.
//   published    full and its bytes final: publish_block registers it under its chain
//                hash (block_hash.h), so match_prefix can find it.
//   shared       ref > 1 (fork_sequence, or attach_prefix by a later request): its bytes
//                must not change; a writer calls make_block_exclusive, which copies it
//                and leaves the original published.
//   cached-free  ref 0 and still published: back in the free queue at the position a
//                plain free block would take, and still found by match_prefix.
//                attach_prefix revives it (a hit), or
//   evicted      the pool hands it out for new content: it is unpublished first
//                (stats.blocks_evicted). The free queue gives out the block freed
//                longest ago first, and a sequence frees its tail before its head,
//                so a chain loses its tail blocks before the head blocks others share.
// A published block about to be written in place is unpublished instead, so the index
// never names changing bytes: make_block_exclusive on an exclusive block, and truncate
// cutting into a block (that table appends into it next).
//
// The engine's side, per request: hashes = chain_block_hashes(prefix_root_hash(identity,
// salt), prompt, block_size); blocks = match_prefix(hashes, prompt); attach_prefix(seq,
// blocks) on the new sequence, which then computes only the tokens after them; once a
// block is full and its K/V written, publish_block(seq, idx, hashes[idx], its tokens).
class KvCacheManager {
 public:
  // faults: a test seam handed to the pool (see BlockPool); null in production.
  KvCacheManager(int num_blocks, int block_size, FaultInjection* faults = nullptr);

  // A new, empty sequence. Ids are never reused, so a stale id is caught by CHECKs.
  SeqId create_sequence();
  // Makes room for num_new_tokens more tokens: allocates the blocks needed so the
  // sequence can hold num_tokens + num_new_tokens. Returns false when the pool does not have
  // enough free blocks or an allocation fails part way: the table is then unchanged and the
  // blocks taken so far are back in the pool (cached-free ones among them were evicted).
  [[nodiscard]] bool reserve(SeqId seq, int num_new_tokens);
  // Marks num_new_tokens more tokens as cached; they must have been reserved.
  void append(SeqId seq, int num_new_tokens);
  const BlockTable& table(SeqId seq) const;
  // Releases all blocks of the sequence (last block first: see free_sequence in
  // the .cc for why) and forgets the sequence. Here and in drop_blocks / truncate,
  // a published block whose last reference goes stays published: it is cached-free.
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
  // When the cut falls inside a published block, it is unpublished: this sequence's next
  // append overwrites its tail (once other holders let go, without a copy). Holders keep it.
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
  // exclusive (nothing to do); an exclusive block that is published is unpublished then,
  // since the caller is about to change its bytes. An error, changing nothing, when the
  // pool has no free block: the caller preempts or skips the eviction, as for a failed
  // reserve. A copied block's original stays published for the sequences still sharing it.
  Result<std::optional<BlockSwap>> make_block_exclusive(SeqId seq, int block_idx);

  // Prefix caching (see the life cycle above).

  // The longest leading run of published blocks for a prompt: hashes[i] is block i's
  // chain hash over tokens[i * block_size, (i + 1) * block_size) (so at most
  // tokens.size() / block_size hashes, a CHECK). Stops at the first miss. Changes nothing.
  std::vector<BlockId> match_prefix(std::span<const BlockHash> hashes, std::span<const TokenId> tokens) const;
  // Gives an empty sequence (0 tokens, 0 blocks: a CHECK) the published blocks
  // match_prefix returned, one reference each (reviving cached-free ones), and sets its
  // token count to blocks.size() × block_size.
  void attach_prefix(SeqId seq, std::span<const BlockId> blocks);
  // Publishes the full block at table index block_idx (block_idx < num_tokens /
  // block_size and tokens.size() == block_size: CHECKs) whose K/V bytes are written and
  // final. False, changing nothing, when it is already published or another block holds
  // that hash (the first stays; this sequence keeps using its own block).
  bool publish_block(SeqId seq, int block_idx, const BlockHash& hash, std::span<const TokenId> tokens);
  bool is_published(BlockId block) const { return prefix_.is_published(block); }
  int num_published_blocks() const { return prefix_.num_published(); }
  // Published blocks no sequence holds: free for allocation, yet still findable.
  int num_cached_free_blocks() const { return num_cached_free_; }
  const PrefixCacheStats& prefix_stats() const { return stats_; }
  const PrefixCache& prefix_cache() const { return prefix_; }

  // KVLM_CHECKs the books: every block's ref count equals the number of tables holding
  // it, free + in-use blocks add up to num_blocks, the cached-free counter matches a
  // recount, and the prefix index is consistent. O(num_blocks + total table length).
  void check_invariants() const;

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
  // Every allocation goes through here: a cached-free block the pool hands out is
  // about to get new content, so it leaves the prefix index first.
  std::optional<BlockId> allocate_block();
  // Releases one reference; true when that was the last one (the block is free now).
  bool release_block(BlockId block);
  // Releases one reference on `block`, adding it to `freed` when that was the last one.
  void release_into(BlockId block, std::vector<BlockId>& freed);
  // Withdraws an exclusive published block whose bytes are about to change.
  void unpublish_for_write(BlockId block);

  int block_size_;
  BlockPool pool_;
  PrefixCache prefix_;
  PrefixCacheStats stats_;
  int num_cached_free_ = 0;  // blocks with ref count 0 that are published
  std::unordered_map<SeqId, BlockTable> tables_;
  int32_t next_seq_id_ = 0;
};

}  // namespace kvlm
