// Chain hashes: pinned values, the documented byte encoding, and what each input changes.
#include "cache/block_hash.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <string>
#include <unordered_set>
#include <vector>

namespace kvlm {
namespace {

constexpr std::string_view kIdentity = "model=stories260K;kv=f16;block=4";

BlockHash from_xxh(XXH128_hash_t h) { return BlockHash{h.low64, h.high64}; }

void put_u64(std::vector<unsigned char>& bytes, uint64_t v) {
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<unsigned char>(v >> (8 * i)));
}
void put_string(std::vector<unsigned char>& bytes, std::string_view s) {
  put_u64(bytes, s.size());
  bytes.insert(bytes.end(), s.begin(), s.end());
}

// Hashes persist nowhere yet, but an engine restart must not silently change them once
// they do: these are the values of encoding v1 with XXH3-128 (stable since xxHash 0.8.0).
TEST(BlockHash, ValuesArePinned) {
  const BlockHash root = prefix_root_hash(kIdentity, "");
  EXPECT_EQ(root, (BlockHash{0x0ed6a682676fe9f0ull, 0x2086d83fb8156690ull}));
  EXPECT_EQ(prefix_root_hash("", ""), (BlockHash{0xf122c31c50aaceb3ull, 0x8f5f643e0c529671ull}));
  const std::vector<TokenId> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<BlockHash> hashes = chain_block_hashes(root, tokens, 4);
  ASSERT_EQ(hashes.size(), 2u);
  EXPECT_EQ(hashes[0], (BlockHash{0x45c6126c2c9e16bbull, 0x4f20f06e31442c6eull}));
  EXPECT_EQ(hashes[1], (BlockHash{0x2af8fa84354591b0ull, 0x6cb1401e0291208bull}));
  EXPECT_EQ(chain_block_hash(BlockHash{}, {}), (BlockHash{0x05ea23ef06e28b2dull, 0xe5189a9599e3f862ull}));
}

// The bytes hashed are exactly the ones the header documents, rebuilt here by hand and
// hashed in one shot.
TEST(BlockHash, HashesTheDocumentedBytes) {
  std::vector<unsigned char> root_bytes;
  put_string(root_bytes, "kvlm.prefix_root.v1");
  put_string(root_bytes, "id");
  put_string(root_bytes, "salt");
  const BlockHash root = prefix_root_hash("id", "salt");
  EXPECT_EQ(root, from_xxh(XXH3_128bits(root_bytes.data(), root_bytes.size())));

  const std::vector<TokenId> tokens = {7, -1, 65536, 0x7fffffff, 42};
  std::vector<unsigned char> block_bytes;
  put_u64(block_bytes, root.low);
  put_u64(block_bytes, root.high);
  for (TokenId t : tokens) {
    const uint32_t u = static_cast<uint32_t>(t);
    for (int i = 0; i < 4; ++i) block_bytes.push_back(static_cast<unsigned char>(u >> (8 * i)));
  }
  EXPECT_EQ(chain_block_hash(root, tokens), from_xxh(XXH3_128bits(block_bytes.data(), block_bytes.size())));
}

TEST(BlockHash, EveryInputChangesTheHash) {
  const std::vector<TokenId> tokens = {10, 11, 12, 13};
  const BlockHash plain = chain_block_hash(prefix_root_hash(kIdentity, ""), tokens);
  // Same tokens under another tenant's salt, another codec, another parent.
  EXPECT_NE(plain, chain_block_hash(prefix_root_hash(kIdentity, "tenant-b"), tokens));
  EXPECT_NE(plain, chain_block_hash(prefix_root_hash("model=stories260K;kv=int8;block=4", ""), tokens));
  EXPECT_NE(plain, chain_block_hash(BlockHash{1, 0}, tokens));
  EXPECT_NE(plain, chain_block_hash(prefix_root_hash(kIdentity, ""), std::vector<TokenId>{10, 11, 13, 12}));
  // Length prefixes: moving bytes between identity and salt is another root.
  EXPECT_NE(prefix_root_hash("ab", "c"), prefix_root_hash("a", "bc"));
  EXPECT_NE(prefix_root_hash("abc", ""), prefix_root_hash("", "abc"));
  // And equal inputs give equal hashes.
  EXPECT_EQ(plain, chain_block_hash(prefix_root_hash(std::string(kIdentity), std::string()), tokens));
}

TEST(BlockHash, ChainCoversFullBlocksAndExtendsAPrefix) {
  const BlockHash root = prefix_root_hash(kIdentity, "");
  std::vector<TokenId> tokens(11);
  for (int i = 0; i < 11; ++i) tokens[static_cast<size_t>(i)] = 100 + i;
  const std::vector<BlockHash> hashes = chain_block_hashes(root, tokens, 4);
  ASSERT_EQ(hashes.size(), 2u);  // the 3 tokens of the partial block have no hash
  const std::span<const TokenId> all(tokens);
  EXPECT_EQ(hashes[0], chain_block_hash(root, all.subspan(0, 4)));
  EXPECT_EQ(hashes[1], chain_block_hash(hashes[0], all.subspan(4, 4)));
  // A prompt that extends another starts with the same hashes.
  const std::vector<BlockHash> shorter = chain_block_hashes(root, all.first(8), 4);
  EXPECT_EQ(shorter, hashes);
  EXPECT_EQ(chain_block_hashes(root, all.first(3), 4).size(), 0u);
  EXPECT_EQ(chain_block_hashes(root, all, 1).size(), 11u);
  // Equal blocks at different depths differ: the parent is part of the hash.
  const std::vector<TokenId> repeated = {5, 5, 5, 5, 5, 5, 5, 5};
  const std::vector<BlockHash> rep = chain_block_hashes(root, repeated, 4);
  EXPECT_NE(rep[0], rep[1]);
}

TEST(BlockHash, StdHashWorksInContainers) {
  const BlockHash root = prefix_root_hash(kIdentity, "");
  std::vector<TokenId> tokens(64);
  for (int i = 0; i < 64; ++i) tokens[static_cast<size_t>(i)] = i;
  std::unordered_set<BlockHash> set;
  for (const BlockHash& h : chain_block_hashes(root, tokens, 1)) EXPECT_TRUE(set.insert(h).second);
  EXPECT_EQ(set.size(), 64u);
  EXPECT_TRUE(set.contains(chain_block_hash(root, std::span<const TokenId>(tokens).first(1))));
  EXPECT_EQ(std::hash<BlockHash>()(BlockHash{3, 4}), std::hash<BlockHash>()(BlockHash{3, 4}));
  EXPECT_NE(std::hash<BlockHash>()(BlockHash{7, 7}), 0u);  // low == high does not fold to 0
}

TEST(BlockHashDeathTest, BlockSizeMustBePositive) {
  const std::vector<TokenId> tokens = {1, 2};
  EXPECT_DEATH(chain_block_hashes(BlockHash{}, tokens, 0), "block_size must be > 0");
}

}  // namespace
}  // namespace kvlm
