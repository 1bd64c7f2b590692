// PrefixCache: the index of published KV blocks, chain hash -> block id, with each block's tokens.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "cache/block_hash.h"
#include "core/ids.h"

namespace kvlm {

// A published block is a full block whose K/V bytes are final, registered under its
// chain hash so a later request with the same prefix can reuse it. The index keeps
// the block's tokens beside the hash and find() compares them: a hash collision can
// make a lookup miss, never return a block holding other tokens. (The tokens before
// the block are covered by the parent inside the chain hash only.)
//
// Bookkeeping only, and no reference counts: KvCacheManager decides when a block is
// published and unpublishes it before its bytes change or its id is reused. At most
// one block per hash: the first published stays, a duplicate is refused.
class PrefixCache {
 public:
  PrefixCache(int num_blocks, int block_size);

  // The block published under `hash` whose tokens equal `tokens` (block_size of
  // them, a CHECK), or nullopt when there is none.
  std::optional<BlockId> find(const BlockHash& hash, std::span<const TokenId> tokens) const;
  // Publishes `block` under `hash` with its block_size tokens. Returns false, changing
  // nothing, when the block is already published or another block holds that hash.
  bool insert(BlockId block, const BlockHash& hash, std::span<const TokenId> tokens);
  // Unpublishes the block; nothing happens when it is not published.
  void erase(BlockId block);

  bool is_published(BlockId block) const;
  int num_published() const { return num_published_; }
  int num_blocks() const { return static_cast<int>(published_.size()); }
  int block_size() const { return block_size_; }

  // The hash and tokens a published block was inserted with (a CHECK that it is published).
  const BlockHash& hash(BlockId block) const;
  std::span<const TokenId> tokens(BlockId block) const;

  // KVLM_CHECKs that the hash map and the per-block records describe the same set.
  void check_invariants() const;

 private:
  void check_id(BlockId block) const;
  std::span<const TokenId> row(int32_t id) const;

  int block_size_;
  std::unordered_map<BlockHash, int32_t> block_by_hash_;  // one entry per published block
  std::vector<uint8_t> published_;                        // [num_blocks]; 1 = in block_by_hash_
  std::vector<BlockHash> hashes_;                         // [num_blocks]; valid where published
  std::vector<TokenId> tokens_;                           // [num_blocks, block_size]; valid where published
  int num_published_ = 0;
};

}  // namespace kvlm
