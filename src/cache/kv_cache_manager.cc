#include "cache/kv_cache_manager.h"

#include "core/check.h"

namespace kvlm {

KvCacheManager::KvCacheManager(int num_blocks, int block_size, FaultInjection* faults)
    : block_size_(block_size), pool_(num_blocks, faults), prefix_(num_blocks, block_size) {
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
  // Check first: the common failure leaves the table and the pool untouched.
  if (missing > pool_.num_free()) return false;
  const int old_num_blocks = t.num_blocks();
  for (int64_t i = 0; i < missing; ++i) {
    const std::optional<BlockId> block = allocate_block();
    if (!block) {
      // An allocation may still fail (allocate() promises only a value, and tests inject it):
      // hand back this call's blocks, newest first, so the caller sees a plain "no room".
      while (t.num_blocks() > old_num_blocks) release_block(t.pop_block());
      return false;
    }
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
  while (t.num_blocks() > 0) release_block(t.pop_block());
  tables_.erase(it);
}

std::optional<BlockId> KvCacheManager::allocate_block() {
  const std::optional<BlockId> block = pool_.allocate();
  if (block && prefix_.is_published(*block)) {
    // A cached-free block reaching the front of the free queue: the least recently
    // freed published block gives up its place in the index for new content.
    prefix_.erase(*block);
    --num_cached_free_;
    ++stats_.blocks_evicted;
  }
  return block;
}

bool KvCacheManager::release_block(BlockId block) {
  pool_.release(block);
  if (pool_.ref_count(block) != 0) return false;
  // Published blocks keep their index entry: their bytes stay intact until reallocated.
  if (prefix_.is_published(block)) ++num_cached_free_;
  return true;
}

void KvCacheManager::release_into(BlockId block, std::vector<BlockId>& freed) {
  if (release_block(block)) freed.push_back(block);
}

void KvCacheManager::unpublish_for_write(BlockId block) {
  KVLM_CHECK(pool_.ref_count(block) > 0, "unpublishing block {} for a write, but no sequence holds it", block.value);
  if (!prefix_.is_published(block)) return;
  prefix_.erase(block);
  ++stats_.blocks_unpublished;
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
  // The cut inside a block: this table appends into it next. Even when other tables
  // share it (and go on reading it), it leaves the index: once they let go, this
  // sequence writes to it as an exclusive block without asking make_block_exclusive.
  if (num_tokens % block_size_ != 0) unpublish_for_write(t.block(num_tokens / block_size_));
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
  if (pool_.ref_count(shared) <= 1) {
    unpublish_for_write(shared);
    return std::optional<BlockSwap>();
  }
  const std::optional<BlockId> copy = allocate_block();
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

std::vector<BlockId> KvCacheManager::match_prefix(std::span<const BlockHash> hashes,
                                                  std::span<const TokenId> tokens) const {
  const size_t b = static_cast<size_t>(block_size_);
  KVLM_CHECK(hashes.size() <= tokens.size() / b, "match_prefix: {} hashes for {} tokens ({} full blocks of {})",
             hashes.size(), tokens.size(), tokens.size() / b, block_size_);
  std::vector<BlockId> hits;
  for (size_t i = 0; i < hashes.size(); ++i) {
    // Block i's hash commits to blocks 0..i-1 through its parent, so past the first
    // miss no later block can belong to this prompt's chain.
    const std::optional<BlockId> hit = prefix_.find(hashes[i], tokens.subspan(i * b, b));
    if (!hit) break;
    hits.push_back(*hit);
  }
  return hits;
}

void KvCacheManager::attach_prefix(SeqId seq, std::span<const BlockId> blocks) {
  BlockTable& t = mutable_table(seq);
  KVLM_CHECK(t.num_tokens() == 0 && t.num_blocks() == 0,
             "sequence {}: attach_prefix needs an empty sequence, it has {} tokens in {} blocks", seq.value,
             t.num_tokens(), t.num_blocks());
  for (BlockId block : blocks) {
    KVLM_CHECK(prefix_.is_published(block), "sequence {}: attach_prefix of block {}, which is not published",
               seq.value, block.value);
    if (pool_.is_free(block)) {
      pool_.take_free(block);  // a cached-free block revived: its bytes were never reused
      --num_cached_free_;
    } else {
      pool_.acquire(block);
    }
    t.push_block(block);
  }
  t.set_num_tokens(static_cast<int>(blocks.size()) * block_size_);
  stats_.prefix_hit_blocks += static_cast<int64_t>(blocks.size());
}

bool KvCacheManager::publish_block(SeqId seq, int block_idx, const BlockHash& hash,
                                   std::span<const TokenId> tokens) {
  const BlockTable& t = table(seq);
  const int num_full = t.num_tokens() / block_size_;
  KVLM_CHECK(block_idx >= 0 && block_idx < num_full,
             "sequence {}: publish_block {} is not one of its {} full blocks ({} tokens)", seq.value, block_idx,
             num_full, t.num_tokens());
  KVLM_CHECK(tokens.size() == static_cast<size_t>(block_size_),
             "sequence {}: publish_block {} with {} tokens, a block holds {}", seq.value, block_idx, tokens.size(),
             block_size_);
  // The block is in a table, so its ref count is > 0: publishing never makes it cached-free.
  const bool inserted = prefix_.insert(t.block(block_idx), hash, tokens);
  if (inserted) ++stats_.blocks_published;
  return inserted;
}

void KvCacheManager::check_invariants() const {
  const int n = pool_.num_blocks();
  std::vector<int32_t> holders(static_cast<size_t>(n), 0);  // [num_blocks]: tables holding each block
  for (const auto& [seq, t] : tables_) {
    for (int32_t id : t.block_ids()) {
      KVLM_CHECK(id >= 0 && id < n, "sequence {} holds block {} outside [0, {})", seq.value, id, n);
      ++holders[static_cast<size_t>(id)];
    }
  }
  int num_in_use = 0;
  int num_cached_free = 0;
  for (int32_t id = 0; id < n; ++id) {
    const int rc = pool_.ref_count(BlockId(id));
    KVLM_CHECK(rc == holders[static_cast<size_t>(id)], "block {} has ref count {} but {} tables hold it", id, rc,
               holders[static_cast<size_t>(id)]);
    if (rc > 0) ++num_in_use;
    if (rc == 0 && prefix_.is_published(BlockId(id))) ++num_cached_free;
  }
  KVLM_CHECK(pool_.num_free() + num_in_use == n, "{} free blocks + {} in use != {} blocks", pool_.num_free(),
             num_in_use, n);
  const std::vector<BlockId> queue = pool_.free_queue();
  KVLM_CHECK(static_cast<int>(queue.size()) == pool_.num_free(), "free queue has {} blocks, num_free says {}",
             queue.size(), pool_.num_free());
  for (BlockId block : queue) {
    KVLM_CHECK(pool_.ref_count(block) == 0, "block {} is in the free queue with ref count {}", block.value,
               pool_.ref_count(block));
  }
  KVLM_CHECK(num_cached_free == num_cached_free_, "{} cached-free blocks, counter says {}", num_cached_free,
             num_cached_free_);
  prefix_.check_invariants();
}

}  // namespace kvlm
