// BlockHash: chained 128-bit hashes naming a full KV block's content, the keys of the prefix cache.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "core/ids.h"

namespace kvlm {

// XXH3-128 of a block's parent hash and its tokens. Two blocks with equal hashes are
// taken to hold the same K/V bytes only after their tokens compare equal too
// (PrefixCache::find), so a collision can at worst miss, never alias two contents
// that differ inside the block.
struct BlockHash {
  uint64_t low = 0;
  uint64_t high = 0;
  friend bool operator==(const BlockHash&, const BlockHash&) = default;
};

// The root of a request's chain. cache_identity names everything that changes a
// block's bytes for the same tokens (model file, K/V codec, key rotation, KIVI
// residual, block size: the engine builds the string); cache_salt separates tenants,
// who never share blocks unless their salts are equal. Both strings are length
// prefixed, so ("ab", "c") and ("a", "bc") give different roots.
BlockHash prefix_root_hash(std::string_view cache_identity, std::string_view cache_salt);

// The hash of one block: XXH3-128 over the parent's 16 bytes (low then high,
// little-endian) followed by the block's token ids as int32 little-endian. A block's
// hash therefore commits to every token before it and to the root.
BlockHash chain_block_hash(const BlockHash& parent, std::span<const TokenId> tokens);

// The hashes of every full block of `tokens`, tokens.size() / block_size of them,
// block 0 chained from `root`. A partial tail block has no hash: its bytes are not final.
std::vector<BlockHash> chain_block_hashes(const BlockHash& root, std::span<const TokenId> tokens, int block_size);

}  // namespace kvlm

template <>
struct std::hash<kvlm::BlockHash> {
  // The halves are already uniformly mixed; the rotation keeps low == high from folding to 0.
  size_t operator()(const kvlm::BlockHash& h) const noexcept {
    return static_cast<size_t>(h.low ^ std::rotl(h.high, 29));
  }
};
