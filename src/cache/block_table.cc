#include "cache/block_table.h"

#include "core/check.h"

namespace kvlm {

BlockTable::BlockTable(int block_size) : block_size_(block_size) {
  KVLM_CHECK(block_size > 0, "block_size must be > 0, got {}", block_size);
}

BlockId BlockTable::block(int block_idx) const {
  KVLM_CHECK(block_idx >= 0 && block_idx < num_blocks(), "block index {} out of range [0, {})", block_idx,
             num_blocks());
  return BlockId(block_ids_[static_cast<size_t>(block_idx)]);
}

BlockSlot BlockTable::slot(int token_idx) const {
  KVLM_CHECK(token_idx >= 0 && token_idx < capacity(), "token {} outside the reserved capacity {} ({} blocks of {})",
             token_idx, capacity(), num_blocks(), block_size_);
  return BlockSlot{BlockId(block_ids_[static_cast<size_t>(token_idx / block_size_)]), token_idx % block_size_};
}

void BlockTable::push_block(BlockId block) {
  KVLM_CHECK(block.valid(), "pushing invalid block id {}", block.value);
  block_ids_.push_back(block.value);
}

BlockId BlockTable::pop_block() {
  KVLM_CHECK(!block_ids_.empty(), "pop_block on an empty table");
  const BlockId last(block_ids_.back());
  block_ids_.pop_back();
  KVLM_CHECK(num_tokens_ <= capacity(), "popping block {} would drop tokens: {} tokens, capacity now {}", last.value,
             num_tokens_, capacity());
  return last;
}

void BlockTable::erase_blocks(int first_block_idx, int count) {
  KVLM_CHECK(count >= 0 && first_block_idx >= 0 && first_block_idx <= num_blocks() - count,
             "erase_blocks [{}, {} + {}) outside the table's {} blocks", first_block_idx, first_block_idx, count,
             num_blocks());
  const int capacity_after = (num_blocks() - count) * block_size_;
  KVLM_CHECK(num_tokens_ <= capacity_after, "erasing {} blocks at {} would drop tokens: {} tokens, capacity after {}",
             count, first_block_idx, num_tokens_, capacity_after);
  const auto first = block_ids_.begin() + first_block_idx;
  block_ids_.erase(first, first + count);
}

void BlockTable::set_block(int block_idx, BlockId block) {
  KVLM_CHECK(block_idx >= 0 && block_idx < num_blocks(), "block index {} out of range [0, {})", block_idx,
             num_blocks());
  KVLM_CHECK(block.valid(), "setting invalid block id {} at index {}", block.value, block_idx);
  block_ids_[static_cast<size_t>(block_idx)] = block.value;
}

void BlockTable::set_num_tokens(int num_tokens) {
  KVLM_CHECK(num_tokens >= 0 && num_tokens <= capacity(), "num_tokens {} outside [0, capacity {}]", num_tokens,
             capacity());
  num_tokens_ = num_tokens;
}

}  // namespace kvlm
