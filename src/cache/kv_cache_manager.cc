#include "cache/kv_cache_manager.h"

#include "core/check.h"

namespace kvlm {

KvCacheManager::KvCacheManager(int num_blocks, int block_size) : block_size_(block_size), pool_(num_blocks) {
  KVLM_CHECK(block_size > 0, "block_size must be > 0, got {}", block_size);
}

SeqId KvCacheManager::create_sequence() {
  const SeqId seq(next_seq_id_++);
  tables_.emplace(seq, BlockTable(block_size_));
  return seq;
}

BlockTable& KvCacheManager::mutable_table(SeqId seq) {
  auto it = tables_.find(seq);
  KVLM_CHECK(it != tables_.end(), "unknown sequence {}", seq.value);
  return it->second;
}

const BlockTable& KvCacheManager::table(SeqId seq) const {
  auto it = tables_.find(seq);
  KVLM_CHECK(it != tables_.end(), "unknown sequence {}", seq.value);
  return it->second;
}

bool KvCacheManager::reserve(SeqId seq, int num_new_tokens) {
  KVLM_CHECK(num_new_tokens >= 0, "sequence {}: num_new_tokens {} < 0", seq.value, num_new_tokens);
  BlockTable& t = mutable_table(seq);
  const int64_t wanted_tokens = static_cast<int64_t>(t.num_tokens()) + num_new_tokens;
  const int64_t wanted_blocks = (wanted_tokens + block_size_ - 1) / block_size_;
  const int64_t missing = wanted_blocks - t.num_blocks();
  if (missing <= 0) return true;
  // Check first, so that a failure leaves the table and the pool untouched.
  if (missing > pool_.num_free()) return false;
  for (int64_t i = 0; i < missing; ++i) {
    const std::optional<BlockId> block = pool_.allocate();
    KVLM_CHECK(block.has_value(), "pool reported {} free blocks but ran out", pool_.num_free());
    t.push_block(*block);
  }
  return true;
}

void KvCacheManager::append(SeqId seq, int num_new_tokens) {
  KVLM_CHECK(num_new_tokens >= 0, "sequence {}: num_new_tokens {} < 0", seq.value, num_new_tokens);
  BlockTable& t = mutable_table(seq);
  const int64_t total = static_cast<int64_t>(t.num_tokens()) + num_new_tokens;
  KVLM_CHECK(total <= t.capacity(), "sequence {}: appending {} tokens to {} exceeds the reserved capacity {}",
             seq.value, num_new_tokens, t.num_tokens(), t.capacity());
  t.set_num_tokens(static_cast<int>(total));
}

void KvCacheManager::free_sequence(SeqId seq) {
  auto it = tables_.find(seq);
  KVLM_CHECK(it != tables_.end(), "free of unknown sequence {}", seq.value);
  // Last block first: the free queue reuses from its front, so a finished
  // sequence's tail blocks are reused before its head blocks. Heads are the
  // blocks most likely to be shared as a prefix later, so they survive longest.
  BlockTable& t = it->second;
  t.set_num_tokens(0);
  while (t.num_blocks() > 0) pool_.release(t.pop_block());
  tables_.erase(it);
}

}  // namespace kvlm
