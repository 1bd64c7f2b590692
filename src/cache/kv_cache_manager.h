// KvCacheManager: the cache facade: sequences, their block tables and the shared block pool.
#pragma once

#include <unordered_map>

#include "cache/block_pool.h"
#include "cache/block_table.h"
#include "core/ids.h"

namespace kvlm {

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

  int block_size_;
  BlockPool pool_;
  std::unordered_map<SeqId, BlockTable> tables_;
  int32_t next_seq_id_ = 0;
};

}  // namespace kvlm
