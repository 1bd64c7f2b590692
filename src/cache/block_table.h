// BlockTable: one sequence's KV block ids in token order and how many tokens they hold.
#pragma once

#include <cstdint>
#include <vector>

#include "core/ids.h"

namespace kvlm {

// Where one token's K/V lives: a block and the slot inside it.
struct BlockSlot {
  BlockId block;
  int offset = 0;  // slot in [0, block_size)
};

// Token i of the sequence lives in block block_ids()[i / block_size] at slot
// i % block_size, in every layer (a block id addresses all layers' arenas).
// The ids are kept as a contiguous int32_t array so kernels can take the table
// as it is. Only KvCacheManager mutates a table; everyone else reads it.
class BlockTable {
 public:
  explicit BlockTable(int block_size);

  int block_size() const { return block_size_; }
  // Tokens whose K/V are in the cache (appended).
  int num_tokens() const { return num_tokens_; }
  int num_blocks() const { return static_cast<int>(block_ids_.size()); }
  // Tokens the blocks can hold: num_blocks × block_size (>= num_tokens).
  int capacity() const { return num_blocks() * block_size_; }

  BlockId block(int block_idx) const;
  // Where token `token_idx` lives; valid for any token_idx < capacity(), so a
  // forward pass can write the K/V of reserved but not yet appended tokens.
  BlockSlot slot(int token_idx) const;

  // The ids as the kernels take them.
  const int32_t* data() const { return block_ids_.data(); }  // [num_blocks]
  const std::vector<int32_t>& block_ids() const { return block_ids_; }

  // Mutators for KvCacheManager (which owns the reference counts behind these ids).
  void push_block(BlockId block);
  BlockId pop_block();
  void set_num_tokens(int num_tokens);
  // Removes the ids at [first_block_idx, first_block_idx + count) and closes the gap, so
  // the blocks after them move down by `count` (token eviction drops whole blocks from
  // the middle of a sequence). The token count must already fit the smaller capacity:
  // lower it with set_num_tokens first.
  void erase_blocks(int first_block_idx, int count);
  // Replaces the id at block_idx (a shared block swapped for a private copy before a write).
  void set_block(int block_idx, BlockId block);

 private:
  int block_size_;
  int num_tokens_ = 0;
  std::vector<int32_t> block_ids_;  // [num_blocks]
};

}  // namespace kvlm
