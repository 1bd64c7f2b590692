// PrefixCache on its own: publish, find, refuse duplicates, and survive forged hash collisions.
#include "cache/prefix_cache.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvlm {
namespace {

using Tokens = std::vector<TokenId>;

TEST(PrefixCache, InsertFindErase) {
  PrefixCache c(4, 3);
  EXPECT_EQ(c.num_blocks(), 4);
  EXPECT_EQ(c.block_size(), 3);
  const BlockHash h1{1, 10};
  const BlockHash h2{2, 20};
  EXPECT_EQ(c.find(h1, Tokens{1, 2, 3}), std::nullopt);
  EXPECT_TRUE(c.insert(BlockId(2), h1, Tokens{1, 2, 3}));
  EXPECT_TRUE(c.insert(BlockId(0), h2, Tokens{4, 5, 6}));
  EXPECT_EQ(c.num_published(), 2);
  EXPECT_EQ(c.find(h1, Tokens{1, 2, 3}), BlockId(2));
  EXPECT_EQ(c.find(h2, Tokens{4, 5, 6}), BlockId(0));
  EXPECT_TRUE(c.is_published(BlockId(2)));
  EXPECT_FALSE(c.is_published(BlockId(1)));
  EXPECT_EQ(c.hash(BlockId(2)), h1);
  EXPECT_EQ(Tokens(c.tokens(BlockId(0)).begin(), c.tokens(BlockId(0)).end()), (Tokens{4, 5, 6}));
  c.check_invariants();

  c.erase(BlockId(2));
  EXPECT_FALSE(c.is_published(BlockId(2)));
  EXPECT_EQ(c.find(h1, Tokens{1, 2, 3}), std::nullopt);
  EXPECT_EQ(c.num_published(), 1);
  c.erase(BlockId(2));  // not published: nothing happens
  c.erase(BlockId(3));
  EXPECT_EQ(c.num_published(), 1);
  // The hash is free again, for any block.
  EXPECT_TRUE(c.insert(BlockId(3), h1, Tokens{1, 2, 3}));
  EXPECT_EQ(c.find(h1, Tokens{1, 2, 3}), BlockId(3));
  c.check_invariants();
}

// Two different contents forged under one hash: lookups with the other tokens miss, and
// the second insert is refused, so the index can never hand out the wrong block.
TEST(PrefixCache, ForgedCollisionNeverReturnsTheWrongBlock) {
  PrefixCache c(4, 2);
  const BlockHash forged{0xdead, 0xbeef};
  EXPECT_TRUE(c.insert(BlockId(1), forged, Tokens{7, 8}));
  EXPECT_EQ(c.find(forged, Tokens{7, 9}), std::nullopt);
  EXPECT_EQ(c.find(forged, Tokens{8, 7}), std::nullopt);
  EXPECT_FALSE(c.insert(BlockId(2), forged, Tokens{7, 9}));  // the first keeps the hash
  EXPECT_FALSE(c.is_published(BlockId(2)));
  EXPECT_EQ(c.find(forged, Tokens{7, 9}), std::nullopt);
  EXPECT_EQ(c.find(forged, Tokens{7, 8}), BlockId(1));
  EXPECT_EQ(c.num_published(), 1);
  c.check_invariants();
}

TEST(PrefixCache, DuplicatesKeepTheFirst) {
  PrefixCache c(3, 1);
  EXPECT_TRUE(c.insert(BlockId(0), BlockHash{5, 5}, Tokens{9}));
  // Same content computed twice: a second block under the same hash is refused.
  EXPECT_FALSE(c.insert(BlockId(1), BlockHash{5, 5}, Tokens{9}));
  // A published block cannot be republished under another hash either.
  EXPECT_FALSE(c.insert(BlockId(0), BlockHash{6, 6}, Tokens{9}));
  EXPECT_EQ(c.find(BlockHash{6, 6}, Tokens{9}), std::nullopt);
  EXPECT_EQ(c.hash(BlockId(0)), (BlockHash{5, 5}));
  EXPECT_EQ(c.find(BlockHash{5, 5}, Tokens{9}), BlockId(0));
  EXPECT_EQ(c.num_published(), 1);
  c.check_invariants();
}

TEST(PrefixCacheDeathTest, MisuseAborts) {
  PrefixCache c(2, 2);
  EXPECT_DEATH(c.insert(BlockId(2), BlockHash{}, Tokens{1, 2}), "block 2 out of range");
  EXPECT_DEATH(c.insert(BlockId(0), BlockHash{}, Tokens{1}), "insert with 1 tokens, a block holds 2");
  EXPECT_DEATH(c.find(BlockHash{}, Tokens{1, 2, 3}), "find with 3 tokens");
  EXPECT_DEATH(c.hash(BlockId(1)), "not published");
  EXPECT_DEATH(c.is_published(BlockId(-1)), "out of range");
  EXPECT_DEATH(PrefixCache(2, 0), "block_size must be > 0");
}

}  // namespace
}  // namespace kvlm
