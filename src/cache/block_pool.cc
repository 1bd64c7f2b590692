#include "cache/block_pool.h"

#include "core/check.h"

namespace kvlm {

BlockPool::BlockPool(int num_blocks, FaultInjection* faults) : faults_(faults) {
  KVLM_CHECK(num_blocks >= 0, "BlockPool needs num_blocks >= 0, got {}", num_blocks);
  ref_counts_.assign(static_cast<size_t>(num_blocks), 0);
  prev_free_.assign(static_cast<size_t>(num_blocks), kNone);
  next_free_.assign(static_cast<size_t>(num_blocks), kNone);
  for (int32_t id = 0; id < num_blocks; ++id) push_back_free(id);
}

void BlockPool::check_id(BlockId block) const {
  KVLM_CHECK(block.value >= 0 && block.value < num_blocks(), "block {} out of range [0, {})", block.value,
             num_blocks());
}

void BlockPool::push_back_free(int32_t id) {
  prev_free_[static_cast<size_t>(id)] = free_tail_;
  next_free_[static_cast<size_t>(id)] = kNone;
  if (free_tail_ == kNone) {
    free_head_ = id;
  } else {
    next_free_[static_cast<size_t>(free_tail_)] = id;
  }
  free_tail_ = id;
  ++num_free_;
}

int32_t BlockPool::pop_front_free() {
  const int32_t id = free_head_;
  unlink_free(id);
  return id;
}

void BlockPool::unlink_free(int32_t id) {
  const int32_t prev = prev_free_[static_cast<size_t>(id)];
  const int32_t next = next_free_[static_cast<size_t>(id)];
  if (prev == kNone) {
    free_head_ = next;
  } else {
    next_free_[static_cast<size_t>(prev)] = next;
  }
  if (next == kNone) {
    free_tail_ = prev;
  } else {
    prev_free_[static_cast<size_t>(next)] = prev;
  }
  prev_free_[static_cast<size_t>(id)] = kNone;
  next_free_[static_cast<size_t>(id)] = kNone;
  --num_free_;
}

std::optional<BlockId> BlockPool::allocate() {
  if (num_free_ == 0) return std::nullopt;
  if (faults_ != nullptr && faults_->should_fail(FaultInjection::Site::kBlockAllocation)) return std::nullopt;
  const int32_t id = pop_front_free();
  KVLM_CHECK(ref_counts_[static_cast<size_t>(id)] == 0, "free block {} has ref count {}", id,
             ref_counts_[static_cast<size_t>(id)]);
  ref_counts_[static_cast<size_t>(id)] = 1;
  return BlockId(id);
}

void BlockPool::acquire(BlockId block) {
  check_id(block);
  int32_t& rc = ref_counts_[static_cast<size_t>(block.value)];
  KVLM_CHECK(rc > 0, "acquire of block {} which is free (ref count {})", block.value, rc);
  ++rc;
}

void BlockPool::release(BlockId block) {
  check_id(block);
  int32_t& rc = ref_counts_[static_cast<size_t>(block.value)];
  KVLM_CHECK(rc > 0, "release of block {} which is already free (double free)", block.value);
  if (--rc == 0) push_back_free(block.value);
}

void BlockPool::take_free(BlockId block) {
  check_id(block);
  int32_t& rc = ref_counts_[static_cast<size_t>(block.value)];
  KVLM_CHECK(rc == 0, "take_free of block {} which is in use (ref count {})", block.value, rc);
  unlink_free(block.value);
  rc = 1;
}

int BlockPool::ref_count(BlockId block) const {
  check_id(block);
  return ref_counts_[static_cast<size_t>(block.value)];
}

std::vector<BlockId> BlockPool::free_queue() const {
  std::vector<BlockId> order;
  order.reserve(static_cast<size_t>(num_free_));
  for (int32_t id = free_head_; id != kNone; id = next_free_[static_cast<size_t>(id)]) order.emplace_back(id);
  return order;
}

}  // namespace kvlm
