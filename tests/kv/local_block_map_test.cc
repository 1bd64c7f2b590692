// LocalBlockMap: slots free → pinned → retained and back, and the order retained slots are taken in.
#include <gtest/gtest.h>

#include "kv/local_block_map.h"

namespace kvlm {
namespace {

TEST(LocalBlockMap, StartsWithEverySlotFree) {
  LocalBlockMap m(/*num_block_ids=*/10, /*num_slots=*/3);
  EXPECT_EQ(m.num_slots(), 3);
  EXPECT_EQ(m.num_pinned(), 0);
  EXPECT_EQ(m.num_retained(), 0);
  EXPECT_EQ(m.peak_pinned(), 0);
  for (int b = 0; b < 10; ++b) {
    EXPECT_EQ(m.slot(b), -1) << b;
    EXPECT_EQ(m.pins(b), 0) << b;
  }
}

// free → pinned → retained → pinned again, keeping its slot throughout.
TEST(LocalBlockMap, APinnedBlockIsRetainedWhenUnpinnedAndKeepsItsSlotWhenPinnedAgain) {
  LocalBlockMap m(10, 3);
  int32_t reclaimed = 42;
  ASSERT_TRUE(m.pin(7, &reclaimed));
  EXPECT_EQ(reclaimed, -1);
  EXPECT_EQ(m.slot(7), 0);  // slot 0 handed out first
  EXPECT_EQ(m.pins(7), 1);
  EXPECT_EQ(m.num_pinned(), 1);
  EXPECT_EQ(m.num_retained(), 0);

  m.unpin(7);
  EXPECT_EQ(m.slot(7), 0);  // retained: still mapped
  EXPECT_EQ(m.pins(7), 0);
  EXPECT_EQ(m.num_pinned(), 0);
  EXPECT_EQ(m.num_retained(), 1);

  reclaimed = 42;
  ASSERT_TRUE(m.pin(7, &reclaimed));
  EXPECT_EQ(reclaimed, -1);
  EXPECT_EQ(m.slot(7), 0);
  EXPECT_EQ(m.pins(7), 1);
  EXPECT_EQ(m.num_pinned(), 1);
  EXPECT_EQ(m.num_retained(), 0);
}

TEST(LocalBlockMap, SlotsAreHandedOutInOrderWhileFree) {
  LocalBlockMap m(10, 3);
  ASSERT_TRUE(m.pin(9));
  ASSERT_TRUE(m.pin(2));
  ASSERT_TRUE(m.pin(5));
  EXPECT_EQ(m.slot(9), 0);
  EXPECT_EQ(m.slot(2), 1);
  EXPECT_EQ(m.slot(5), 2);
}

TEST(LocalBlockMap, EveryPinNeedsItsUnpin) {
  LocalBlockMap m(10, 2);
  ASSERT_TRUE(m.pin(4));
  ASSERT_TRUE(m.pin(4));
  ASSERT_TRUE(m.pin(4));
  EXPECT_EQ(m.pins(4), 3);
  EXPECT_EQ(m.num_pinned(), 1);  // slots, not pins
  m.unpin(4);
  m.unpin(4);
  EXPECT_EQ(m.pins(4), 1);
  EXPECT_EQ(m.num_retained(), 0);
  // Still pinned: a pin of another block may not take it once the free slot is gone.
  ASSERT_TRUE(m.pin(5));
  EXPECT_FALSE(m.pin(6));
  m.unpin(4);
  EXPECT_EQ(m.num_retained(), 1);
  int32_t reclaimed = -1;
  ASSERT_TRUE(m.pin(6, &reclaimed));
  EXPECT_EQ(reclaimed, 4);
}

// The free slots go first, then the retained ones, the one unpinned longest ago first; a
// retained block pinned and unpinned again goes to the back of the line.
TEST(LocalBlockMap, RetainedSlotsAreTakenOldestUnpinnedFirst) {
  LocalBlockMap m(20, 3);
  for (int b : {1, 2, 3}) ASSERT_TRUE(m.pin(b));
  m.unpin(2);
  m.unpin(3);
  m.unpin(1);  // retained, oldest first: 2, 3, 1
  EXPECT_EQ(m.num_retained(), 3);

  ASSERT_TRUE(m.pin(3));  // a hit: 3 leaves the line ...
  m.unpin(3);             // ... and rejoins it at the back: 2, 1, 3
  int32_t reclaimed = -1;
  ASSERT_TRUE(m.pin(10, &reclaimed));
  EXPECT_EQ(reclaimed, 2);
  EXPECT_EQ(m.slot(2), -1);
  EXPECT_EQ(m.slot(10), 1);  // 2's slot
  ASSERT_TRUE(m.pin(11, &reclaimed));
  EXPECT_EQ(reclaimed, 1);
  EXPECT_EQ(m.slot(11), 0);
  ASSERT_TRUE(m.pin(12, &reclaimed));
  EXPECT_EQ(reclaimed, 3);
  EXPECT_EQ(m.slot(12), 2);
  EXPECT_EQ(m.num_retained(), 0);
  EXPECT_EQ(m.num_pinned(), 3);
  for (int b : {1, 2, 3}) EXPECT_EQ(m.slot(b), -1) << b;
}

// A free slot is taken before any retained one.
TEST(LocalBlockMap, FreeSlotsGoBeforeRetainedOnes) {
  LocalBlockMap m(10, 3);
  ASSERT_TRUE(m.pin(0));
  m.unpin(0);
  int32_t reclaimed = 42;
  ASSERT_TRUE(m.pin(1, &reclaimed));
  ASSERT_TRUE(m.pin(2, &reclaimed));
  EXPECT_EQ(reclaimed, -1);
  EXPECT_EQ(m.slot(0), 0);  // still retained
  ASSERT_TRUE(m.pin(3, &reclaimed));
  EXPECT_EQ(reclaimed, 0);
}

// Every slot pinned: pin fails and changes nothing.
TEST(LocalBlockMap, PinFailsWhenEverySlotIsPinned) {
  LocalBlockMap m(10, 2);
  ASSERT_TRUE(m.pin(0));
  ASSERT_TRUE(m.pin(1));
  int32_t reclaimed = 42;
  EXPECT_FALSE(m.pin(2, &reclaimed));
  EXPECT_EQ(reclaimed, -1);
  EXPECT_EQ(m.slot(2), -1);
  EXPECT_EQ(m.pins(2), 0);
  EXPECT_EQ(m.slot(0), 0);
  EXPECT_EQ(m.slot(1), 1);
  EXPECT_EQ(m.num_pinned(), 2);
  EXPECT_EQ(m.num_retained(), 0);
  // A block that holds a slot can always take one more pin.
  EXPECT_TRUE(m.pin(1));
  EXPECT_EQ(m.pins(1), 2);
}

TEST(LocalBlockMap, FreeSlotUnmapsARetainedBlock) {
  LocalBlockMap m(10, 2);
  ASSERT_TRUE(m.pin(3));
  ASSERT_TRUE(m.pin(4));
  m.unpin(3);
  m.unpin(4);
  m.free_slot(3);
  EXPECT_EQ(m.slot(3), -1);
  EXPECT_EQ(m.num_retained(), 1);
  m.free_slot(3);  // no slot: no-op
  m.free_slot(9);  // never mapped: no-op
  EXPECT_EQ(m.num_retained(), 1);
  // The freed slot is taken before the retained one, and 3 is no longer in the line.
  int32_t reclaimed = 42;
  ASSERT_TRUE(m.pin(5, &reclaimed));
  EXPECT_EQ(reclaimed, -1);
  EXPECT_EQ(m.slot(5), 0);
  ASSERT_TRUE(m.pin(6, &reclaimed));
  EXPECT_EQ(reclaimed, 4);
  EXPECT_FALSE(m.pin(7, &reclaimed));
}

TEST(LocalBlockMap, PeakCountsPinnedSlots) {
  LocalBlockMap m(10, 4);
  ASSERT_TRUE(m.pin(0));
  ASSERT_TRUE(m.pin(0));  // a second pin of one slot is still one slot
  ASSERT_TRUE(m.pin(1));
  EXPECT_EQ(m.peak_pinned(), 2);
  m.unpin(0);
  m.unpin(0);
  m.unpin(1);
  EXPECT_EQ(m.num_pinned(), 0);
  EXPECT_EQ(m.peak_pinned(), 2);
  for (int b : {2, 3, 4}) ASSERT_TRUE(m.pin(b));
  EXPECT_EQ(m.peak_pinned(), 3);
  EXPECT_EQ(m.num_retained(), 1);
  EXPECT_EQ(m.slot(0), -1);  // unpinned first, so reclaimed by 4 once slots 2 and 3 were taken
  EXPECT_EQ(m.slot(1), 1);
}

TEST(LocalBlockMapDeathTest, UnpinningWhatIsNotPinnedAborts) {
  LocalBlockMap m(10, 2);
  EXPECT_DEATH(m.unpin(3), "local block 3 is not pinned");
  ASSERT_TRUE(m.pin(3));
  m.unpin(3);
  EXPECT_DEATH(m.unpin(3), "local block 3 is not pinned");  // retained
}

TEST(LocalBlockMapDeathTest, FreeingAPinnedSlotAborts) {
  LocalBlockMap m(10, 2);
  ASSERT_TRUE(m.pin(3));
  ASSERT_TRUE(m.pin(3));
  EXPECT_DEATH(m.free_slot(3), "local block 3 is pinned 2 times");
}

}  // namespace
}  // namespace kvlm
