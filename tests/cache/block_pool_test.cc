#include "cache/block_pool.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvlm {
namespace {

std::vector<int> ids(const std::vector<BlockId>& blocks) {
  std::vector<int> out;
  for (BlockId b : blocks) out.push_back(b.value);
  return out;
}

TEST(BlockPool, HandsOutIdsInOrderUntilFull) {
  BlockPool pool(4);
  EXPECT_EQ(pool.num_blocks(), 4);
  EXPECT_EQ(pool.num_free(), 4);
  EXPECT_EQ(ids(pool.free_queue()), (std::vector<int>{0, 1, 2, 3}));
  for (int expected = 0; expected < 4; ++expected) {
    const std::optional<BlockId> b = pool.allocate();
    ASSERT_TRUE(b.has_value());
    EXPECT_EQ(b->value, expected);
    EXPECT_EQ(pool.ref_count(*b), 1);
  }
  EXPECT_EQ(pool.num_free(), 0);
  EXPECT_EQ(pool.allocate(), std::nullopt);  // no room is a value, not an error
  EXPECT_EQ(pool.allocate(), std::nullopt);
}

TEST(BlockPool, FreedBlocksJoinTheBackOfTheQueue) {
  BlockPool pool(5);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(pool.allocate());
  pool.release(BlockId(3));
  pool.release(BlockId(0));
  pool.release(BlockId(4));
  EXPECT_EQ(ids(pool.free_queue()), (std::vector<int>{3, 0, 4}));
  EXPECT_EQ(pool.num_free(), 3);
  // The block freed longest ago is reused first.
  EXPECT_EQ(pool.allocate()->value, 3);
  pool.release(BlockId(1));
  EXPECT_EQ(ids(pool.free_queue()), (std::vector<int>{0, 4, 1}));
  EXPECT_EQ(pool.allocate()->value, 0);
  EXPECT_EQ(pool.allocate()->value, 4);
  EXPECT_EQ(pool.allocate()->value, 1);
  EXPECT_EQ(pool.allocate(), std::nullopt);
  EXPECT_TRUE(pool.free_queue().empty());
}

TEST(BlockPool, SharedBlockIsFreedOnlyByTheLastRelease) {
  BlockPool pool(2);
  const BlockId b = *pool.allocate();
  pool.acquire(b);
  pool.acquire(b);
  EXPECT_EQ(pool.ref_count(b), 3);
  pool.release(b);
  EXPECT_EQ(pool.ref_count(b), 2);
  EXPECT_EQ(pool.num_free(), 1);
  pool.release(b);
  EXPECT_EQ(pool.num_free(), 1);
  pool.release(b);
  EXPECT_EQ(pool.ref_count(b), 0);
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_EQ(ids(pool.free_queue()), (std::vector<int>{1, 0}));
}

// A prefix hit on a free block takes it from wherever it sits; the rest keep their order.
TEST(BlockPool, TakeFreeRemovesABlockFromAnywhereInTheQueue) {
  BlockPool pool(5);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(pool.allocate());
  for (int id : {3, 0, 4, 1}) pool.release(BlockId(id));
  EXPECT_EQ(ids(pool.free_queue()), (std::vector<int>{3, 0, 4, 1}));
  EXPECT_TRUE(pool.is_free(BlockId(0)));
  EXPECT_FALSE(pool.is_free(BlockId(2)));
  pool.take_free(BlockId(0));  // the middle
  EXPECT_EQ(pool.ref_count(BlockId(0)), 1);
  EXPECT_FALSE(pool.is_free(BlockId(0)));
  EXPECT_EQ(ids(pool.free_queue()), (std::vector<int>{3, 4, 1}));
  EXPECT_EQ(pool.num_free(), 3);
  pool.take_free(BlockId(1));  // the back
  EXPECT_EQ(ids(pool.free_queue()), (std::vector<int>{3, 4}));
  pool.take_free(BlockId(3));  // the front
  EXPECT_EQ(ids(pool.free_queue()), (std::vector<int>{4}));
  // The links stay sound: releases join the back, allocation takes the front.
  pool.release(BlockId(0));
  pool.release(BlockId(3));
  EXPECT_EQ(ids(pool.free_queue()), (std::vector<int>{4, 0, 3}));
  pool.take_free(BlockId(4));  // the front again
  EXPECT_EQ(pool.allocate()->value, 0);
  EXPECT_EQ(pool.allocate()->value, 3);
  EXPECT_EQ(pool.num_free(), 0);
  EXPECT_TRUE(pool.free_queue().empty());
  pool.release(BlockId(2));
  pool.take_free(BlockId(2));  // the only block in the queue
  EXPECT_TRUE(pool.free_queue().empty());
  EXPECT_EQ(pool.allocate(), std::nullopt);
  pool.release(BlockId(1));
  EXPECT_EQ(ids(pool.free_queue()), (std::vector<int>{1}));
}

TEST(BlockPool, EmptyPoolHasNoRoom) {
  BlockPool pool(0);
  EXPECT_EQ(pool.num_free(), 0);
  EXPECT_EQ(pool.allocate(), std::nullopt);
}

TEST(BlockPoolDeathTest, MisuseAborts) {
  BlockPool pool(2);
  const BlockId b = *pool.allocate();
  pool.release(b);
  EXPECT_DEATH(pool.release(b), "double free");
  EXPECT_DEATH(pool.acquire(BlockId(1)), "which is free");
  EXPECT_DEATH(pool.release(BlockId(2)), "block 2 out of range");
  EXPECT_DEATH(pool.ref_count(BlockId(-1)), "out of range");
  EXPECT_EQ(pool.allocate()->value, 1);
  EXPECT_DEATH(pool.take_free(BlockId(1)), "take_free of block 1 which is in use \\(ref count 1\\)");
}

}  // namespace
}  // namespace kvlm
