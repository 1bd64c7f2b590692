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

void KvCacheManager::release_into(BlockId block, std::vector<BlockId>& freed) {
  pool_.release(block);
  if (pool_.ref_count(block) == 0) freed.push_back(block);
}

std::vector<BlockId> KvCacheManager::drop_blocks(SeqId seq, int first_block_idx, int count) {
  BlockTable& t = mutable_table(seq);
  const int num_full = t.num_tokens() / block_size_;
  KVLM_CHECK(count >= 0 && first_block_idx >= 0 && first_block_idx <= num_full - count,
             "sequence {}: drop_blocks [{}, {} + {}) is not inside its {} full blocks ({} tokens)", seq.value,
             first_block_idx, first_block_idx, count, num_full, t.num_tokens());
  std::vector<BlockId> dropped;
  dropped.reserve(static_cast<size_t>(count));
  for (int i = first_block_idx; i < first_block_idx + count; ++i) dropped.push_back(t.block(i));
  t.set_num_tokens(t.num_tokens() - count * block_size_);
  t.erase_blocks(first_block_idx, count);
  std::vector<BlockId> freed;
  for (auto it = dropped.rbegin(); it != dropped.rend(); ++it) release_into(*it, freed);
  return freed;
}

std::vector<BlockId> KvCacheManager::truncate(SeqId seq, int num_tokens) {
  BlockTable& t = mutable_table(seq);
  KVLM_CHECK(num_tokens >= 0 && num_tokens <= t.num_tokens(), "sequence {}: truncate to {} tokens, it has {}",
             seq.value, num_tokens, t.num_tokens());
  t.set_num_tokens(num_tokens);
  std::vector<BlockId> freed;
  while (t.num_blocks() > blocks_for_tokens(num_tokens)) release_into(t.pop_block(), freed);
  return freed;
}

SeqId KvCacheManager::fork_sequence(SeqId src) {
  BlockTable copy = table(src);
  for (int32_t id : copy.block_ids()) pool_.acquire(BlockId(id));
  const SeqId seq(next_seq_id_++);
  tables_.emplace(seq, std::move(copy));
  return seq;
}

int KvCacheManager::block_ref_count(SeqId seq, int block_idx) const {
  return pool_.ref_count(table(seq).block(block_idx));
}

Result<std::optional<BlockSwap>> KvCacheManager::make_block_exclusive(SeqId seq, int block_idx) {
  BlockTable& t = mutable_table(seq);
  const BlockId shared = t.block(block_idx);
  if (pool_.ref_count(shared) <= 1) return std::optional<BlockSwap>();
  const std::optional<BlockId> copy = pool_.allocate();
  if (!copy) {
    return Status::errorf(
        "sequence {}: no free KV block to copy shared block {} (index {}, {} references) before writing to it; "
        "all {} blocks are in use",
        seq.value, shared.value, block_idx, pool_.ref_count(shared), pool_.num_blocks());
  }
  t.set_block(block_idx, *copy);
  // Other tables still hold the shared block, so this never frees it.
  pool_.release(shared);
  return std::optional<BlockSwap>(BlockSwap{shared, *copy});
}

}  // namespace kvlm
