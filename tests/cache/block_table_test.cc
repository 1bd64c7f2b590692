#include "cache/block_table.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvlm {
namespace {

TEST(BlockTable, MapsTokensToBlocksAndSlots) {
  BlockTable t(4);
  EXPECT_EQ(t.capacity(), 0);
  t.push_block(BlockId(7));
  t.push_block(BlockId(2));
  t.push_block(BlockId(9));
  EXPECT_EQ(t.num_blocks(), 3);
  EXPECT_EQ(t.capacity(), 12);
  EXPECT_EQ(t.num_tokens(), 0);
  const int expected_block[] = {7, 7, 7, 7, 2, 2, 2, 2, 9, 9, 9, 9};
  for (int i = 0; i < 12; ++i) {
    const BlockSlot s = t.slot(i);
    EXPECT_EQ(s.block.value, expected_block[i]) << i;
    EXPECT_EQ(s.offset, i % 4) << i;
  }
  // Contiguous ids for kernels.
  ASSERT_EQ(t.block_ids().size(), 3u);
  EXPECT_EQ(t.data()[0], 7);
  EXPECT_EQ(t.data()[1], 2);
  EXPECT_EQ(t.data()[2], 9);
  EXPECT_EQ(t.block(1).value, 2);
  t.set_num_tokens(9);
  EXPECT_EQ(t.num_tokens(), 9);
  t.set_num_tokens(8);
  EXPECT_EQ(t.pop_block().value, 9);
  EXPECT_EQ(t.capacity(), 8);
}

TEST(BlockTableDeathTest, RefusesTokensOutsideItsBlocks) {
  BlockTable t(4);
  t.push_block(BlockId(0));
  EXPECT_DEATH(t.slot(4), "outside the reserved capacity");
  EXPECT_DEATH(t.set_num_tokens(5), "outside");
  t.set_num_tokens(3);
  t.push_block(BlockId(1));
  t.set_num_tokens(5);
  EXPECT_DEATH(t.pop_block(), "would drop tokens");
  EXPECT_DEATH(BlockTable(0), "block_size must be > 0");
}

std::vector<int32_t> ids(const BlockTable& t) { return t.block_ids(); }

TEST(BlockTable, EraseBlocksClosesTheGapAndSetBlockReplacesOne) {
  BlockTable t(2);
  for (int id : {5, 3, 8, 1, 6}) t.push_block(BlockId(id));
  t.set_num_tokens(6);
  t.erase_blocks(1, 2);  // 3 and 8 go; 4 tokens still fit in the 3 blocks left
  EXPECT_EQ(ids(t), (std::vector<int32_t>{5, 1, 6}));
  EXPECT_EQ(t.num_tokens(), 6);
  EXPECT_EQ(t.slot(2).block.value, 1);
  t.erase_blocks(3, 0);  // an empty range at the end is allowed
  t.set_block(2, BlockId(9));
  EXPECT_EQ(ids(t), (std::vector<int32_t>{5, 1, 9}));
  t.set_num_tokens(2);
  t.erase_blocks(1, 2);
  EXPECT_EQ(ids(t), (std::vector<int32_t>{5}));
}

TEST(BlockTableDeathTest, EraseAndSetCheckTheirRanges) {
  BlockTable t(4);
  for (int id : {0, 1, 2}) t.push_block(BlockId(id));
  t.set_num_tokens(9);
  EXPECT_DEATH(t.erase_blocks(2, 2), "outside the table's 3 blocks");
  EXPECT_DEATH(t.erase_blocks(-1, 1), "outside the table's 3 blocks");
  EXPECT_DEATH(t.erase_blocks(0, 1), "would drop tokens");
  EXPECT_DEATH(t.set_block(3, BlockId(7)), "out of range");
  EXPECT_DEATH(t.set_block(0, BlockId()), "invalid block id");
}

}  // namespace
}  // namespace kvlm
