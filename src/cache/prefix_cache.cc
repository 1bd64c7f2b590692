#include "cache/prefix_cache.h"

#include <algorithm>

#include "core/check.h"

namespace kvlm {

PrefixCache::PrefixCache(int num_blocks, int block_size) : block_size_(block_size) {
  KVLM_CHECK(num_blocks >= 0, "PrefixCache needs num_blocks >= 0, got {}", num_blocks);
  KVLM_CHECK(block_size > 0, "block_size must be > 0, got {}", block_size);
  const size_t n = static_cast<size_t>(num_blocks);
  // Every block could be published at once: size everything for that up front, so
  // publishing never allocates token storage and the map never rehashes.
  block_by_hash_.reserve(n);
  published_.assign(n, 0);
  hashes_.assign(n, BlockHash{});
  tokens_.assign(n * static_cast<size_t>(block_size), 0);
}

void PrefixCache::check_id(BlockId block) const {
  KVLM_CHECK(block.value >= 0 && block.value < num_blocks(), "block {} out of range [0, {})", block.value,
             num_blocks());
}

std::span<const TokenId> PrefixCache::row(int32_t id) const {
  const size_t b = static_cast<size_t>(block_size_);
  return std::span<const TokenId>(tokens_).subspan(static_cast<size_t>(id) * b, b);
}

std::optional<BlockId> PrefixCache::find(const BlockHash& hash, std::span<const TokenId> tokens) const {
  KVLM_CHECK(tokens.size() == static_cast<size_t>(block_size_), "find with {} tokens, a block holds {}",
             tokens.size(), block_size_);
  const auto it = block_by_hash_.find(hash);
  if (it == block_by_hash_.end()) return std::nullopt;
  const std::span<const TokenId> stored = row(it->second);
  if (!std::equal(stored.begin(), stored.end(), tokens.begin())) return std::nullopt;  // a collision
  return BlockId(it->second);
}

bool PrefixCache::insert(BlockId block, const BlockHash& hash, std::span<const TokenId> tokens) {
  check_id(block);
  KVLM_CHECK(tokens.size() == static_cast<size_t>(block_size_), "block {}: insert with {} tokens, a block holds {}",
             block.value, tokens.size(), block_size_);
  const size_t id = static_cast<size_t>(block.value);
  if (published_[id] != 0) return false;
  // try_emplace leaves the map alone when the hash is taken: the first block stays.
  if (!block_by_hash_.try_emplace(hash, block.value).second) return false;
  published_[id] = 1;
  hashes_[id] = hash;
  std::copy(tokens.begin(), tokens.end(), tokens_.begin() + static_cast<std::ptrdiff_t>(id * tokens.size()));
  ++num_published_;
  return true;
}

void PrefixCache::erase(BlockId block) {
  check_id(block);
  const size_t id = static_cast<size_t>(block.value);
  if (published_[id] == 0) return;
  const auto it = block_by_hash_.find(hashes_[id]);
  KVLM_CHECK(it != block_by_hash_.end() && it->second == block.value,
             "published block {} is not the index entry for its hash", block.value);
  block_by_hash_.erase(it);
  published_[id] = 0;
  --num_published_;
}

bool PrefixCache::is_published(BlockId block) const {
  check_id(block);
  return published_[static_cast<size_t>(block.value)] != 0;
}

const BlockHash& PrefixCache::hash(BlockId block) const {
  KVLM_CHECK(is_published(block), "hash of block {}, which is not published", block.value);
  return hashes_[static_cast<size_t>(block.value)];
}

std::span<const TokenId> PrefixCache::tokens(BlockId block) const {
  KVLM_CHECK(is_published(block), "tokens of block {}, which is not published", block.value);
  return row(block.value);
}

void PrefixCache::check_invariants() const {
  int recount = 0;
  for (int32_t id = 0; id < num_blocks(); ++id) {
    if (published_[static_cast<size_t>(id)] == 0) continue;
    ++recount;
    const auto it = block_by_hash_.find(hashes_[static_cast<size_t>(id)]);
    KVLM_CHECK(it != block_by_hash_.end(), "published block {} is missing from the hash index", id);
    KVLM_CHECK(it->second == id, "published block {}: its hash maps to block {}", id, it->second);
  }
  KVLM_CHECK(recount == num_published_, "{} blocks marked published, counter says {}", recount, num_published_);
  // Each published block has its own entry, so equal sizes leave no stale entries.
  KVLM_CHECK(block_by_hash_.size() == static_cast<size_t>(num_published_),
             "hash index has {} entries for {} published blocks", block_by_hash_.size(), num_published_);
}

}  // namespace kvlm
