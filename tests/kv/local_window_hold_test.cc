// LocalWindowHold: one sequence's local-layer pins over its block table, through every change
// the table goes through (growth, the window passing, eviction, truncation, hits, copy on write).
#include <gtest/gtest.h>

#include <vector>

#include "kv/kv_storage.h"
#include "kv/local_window_hold.h"

namespace kvlm {
namespace {

// 2 layers: 0 local, 1 global; 4 tokens per block.
const KvLayout kLayout{.num_layers = 2, .num_kv_heads = 1, .head_dim = 4, .block_size = 4};

KvStorageOptions local_options(int local_slots) {
  KvStorageOptions o;
  o.local_layers = {1, 0};
  o.local_num_blocks = local_slots;
  return o;
}

std::vector<int> pins(const KvStorage& s, const std::vector<int32_t>& table) {
  std::vector<int> p;
  for (int32_t b : table) p.push_back(s.local_pins(BlockId(b)));
  return p;
}

std::vector<bool> cached(const KvStorage& s, const std::vector<int32_t>& table) {
  std::vector<bool> c;
  for (int32_t b : table) c.push_back(s.local_block_cached(BlockId(b)));
  return c;
}

// A hold over entries [2, 6) of an 8-entry table, entries 0, 1, 6, 7 retained.
struct HoldFixture {
  KvStorage s{kLayout, KvType::kF32, KvType::kF32, 16, local_options(8)};
  std::vector<int32_t> table = {11, 4, 9, 0, 13, 2, 7, 5};
  LocalWindowHold hold;

  HoldFixture() {
    EXPECT_TRUE(hold.extend(s, table));
    hold.release_before(s, table, 8);
    hold.truncate(s, table, 6);
    EXPECT_EQ(hold.begin(), 2);
    EXPECT_EQ(hold.end(), 6);
    EXPECT_EQ(pins(s, table), (std::vector<int>{0, 0, 1, 1, 1, 1, 0, 0}));
  }
};

TEST(LocalWindowHold, ExtendPinsTheEntriesAppendedSinceTheLastCall) {
  KvStorage s(kLayout, KvType::kF32, KvType::kF32, 16, local_options(6));
  LocalWindowHold hold;
  std::vector<int32_t> table = {3, 7, 1};
  ASSERT_TRUE(hold.extend(s, table));
  EXPECT_EQ(hold.begin(), 0);
  EXPECT_EQ(hold.end(), 3);
  EXPECT_EQ(pins(s, table), (std::vector<int>{1, 1, 1}));
  ASSERT_TRUE(hold.extend(s, table));  // nothing new
  EXPECT_EQ(pins(s, table), (std::vector<int>{1, 1, 1}));
  table.push_back(9);
  table.push_back(4);
  ASSERT_TRUE(hold.extend(s, table));
  EXPECT_EQ(hold.end(), 5);
  EXPECT_EQ(pins(s, table), (std::vector<int>{1, 1, 1, 1, 1}));
  EXPECT_EQ(s.local_blocks_in_use(), 5);
  EXPECT_TRUE(hold.covers(0));
  EXPECT_TRUE(hold.covers(4));
  EXPECT_FALSE(hold.covers(5));
  // The pinned blocks can be written.
  const std::vector<float> x(4, 1.5f);
  s.write_token(0, BlockId(4), 3, x.data(), x.data());
}

// Out of slots: false, and no entry of the failed call is pinned.
TEST(LocalWindowHold, ExtendFailsPinningNothingWhenTheSlotsRunOut) {
  KvStorage s(kLayout, KvType::kF32, KvType::kF32, 16, local_options(6));
  LocalWindowHold hold;
  std::vector<int32_t> table = {3, 7, 1, 9, 4};
  ASSERT_TRUE(hold.extend(s, table));
  table.push_back(12);
  table.push_back(8);  // 7 entries, 6 slots
  EXPECT_FALSE(hold.extend(s, table));
  EXPECT_EQ(hold.end(), 5);
  EXPECT_EQ(s.local_blocks_in_use(), 5);
  EXPECT_EQ(pins(s, table), (std::vector<int>{1, 1, 1, 1, 1, 0, 0}));
  // The window passes the first two blocks: their retained slots can be reclaimed, oldest first.
  hold.release_before(s, table, 8);
  ASSERT_TRUE(hold.extend(s, table));
  EXPECT_EQ(hold.begin(), 2);
  EXPECT_EQ(hold.end(), 7);
  EXPECT_EQ(pins(s, table), (std::vector<int>{0, 0, 1, 1, 1, 1, 1}));
  EXPECT_EQ(cached(s, table), (std::vector<bool>{false, true, true, true, true, true, true}));
}

TEST(LocalWindowHold, ReleaseBeforeUnpinsTheEntriesWhollyBeforeTheFirstNeededToken) {
  KvStorage s(kLayout, KvType::kF32, KvType::kF32, 16, local_options(8));
  LocalWindowHold hold;
  std::vector<int32_t> table = {3, 7, 1, 9, 4};
  ASSERT_TRUE(hold.extend(s, table));
  hold.release_before(s, table, 3);  // token 3 is in entry 0
  EXPECT_EQ(hold.begin(), 0);
  hold.release_before(s, table, 11);  // token 11 is in entry 2: entries 0 and 1 go
  EXPECT_EQ(hold.begin(), 2);
  EXPECT_EQ(pins(s, table), (std::vector<int>{0, 0, 1, 1, 1}));
  EXPECT_EQ(cached(s, table), (std::vector<bool>{true, true, true, true, true}));  // retained
  EXPECT_EQ(s.local_blocks_retained(), 2);
  for (int64_t back : {8, 5, 0, -3}) {  // the window never moves back
    hold.release_before(s, table, back);
    EXPECT_EQ(hold.begin(), 2) << back;
  }
  EXPECT_EQ(pins(s, table), (std::vector<int>{0, 0, 1, 1, 1}));
  hold.release_before(s, table, 12);
  EXPECT_EQ(hold.begin(), 3);
  hold.release_before(s, table, 1000);  // past the table: begin stops at end
  EXPECT_EQ(hold.begin(), 5);
  EXPECT_EQ(hold.end(), 5);
  EXPECT_EQ(s.local_blocks_in_use(), 0);
  table.push_back(6);
  ASSERT_TRUE(hold.extend(s, table));
  EXPECT_EQ(pins(s, table), (std::vector<int>{0, 0, 0, 0, 0, 1}));
  EXPECT_EQ(hold.begin(), 5);
  EXPECT_EQ(hold.end(), 6);
}

// The window slides over a decoding sequence: never more than local_blocks_per_sequence slots,
// and every token inside the window reads back.
TEST(LocalWindowHold, ASlidingWindowHoldsNoMoreThanLocalBlocksPerSequence) {
  const int window = 6;
  const int per_sequence = KvStorage::local_blocks_per_sequence(window, 4, 1);  // ceil(6/4) + 1 = 3
  KvStorage s(kLayout, KvType::kF32, KvType::kF32, 16, local_options(per_sequence));
  LocalWindowHold hold;
  std::vector<int32_t> table;
  for (int pos = 0; pos < 40; ++pos) {
    if (pos % 4 == 0) table.push_back(15 - pos / 4);
    ASSERT_TRUE(hold.extend(s, table)) << pos;
    const std::vector<float> x(4, static_cast<float>(pos));
    for (int l = 0; l < 2; ++l) s.write_tokens(l, table, pos, 1, x.data(), x.data());
    // The query at pos sees [pos - window + 1, pos]; the next one starts a token later.
    for (int t = std::max(0, pos - window + 1); t <= pos; ++t) {
      std::vector<float> k(4), v(4);
      s.read_token(0, BlockId(table[static_cast<size_t>(t / 4)]), t % 4, k.data(), v.data());
      ASSERT_EQ(k[0], static_cast<float>(t)) << "pos " << pos << " token " << t;
    }
    hold.release_before(s, table, pos + 2 - window);
    ASSERT_LE(s.local_blocks_in_use(), per_sequence) << pos;
  }
  EXPECT_EQ(s.peak_local_blocks_in_use(), per_sequence);
  hold.release_all(s, table);
  EXPECT_EQ(s.local_blocks_in_use(), 0);
}

struct DropCase {
  int first, count;
  int begin, end;  // the hold's range afterwards
};

// drop unpins the dropped entries the hold covers and renumbers the rest: ranges before the
// hold, overlapping its start, inside, overlapping its end, after it, and covering it.
TEST(LocalWindowHold, DropUnpinsTheDroppedEntriesAndRenumbers) {
  for (const DropCase& c : {DropCase{0, 1, 1, 5}, DropCase{0, 2, 0, 4}, DropCase{1, 2, 1, 4}, DropCase{3, 2, 2, 4},
                            DropCase{2, 4, 2, 2}, DropCase{5, 2, 2, 5}, DropCase{6, 2, 2, 6}, DropCase{7, 1, 2, 6},
                            DropCase{1, 6, 1, 1}, DropCase{0, 8, 0, 0}, DropCase{3, 0, 2, 6}}) {
    SCOPED_TRACE(testing::Message() << "drop [" << c.first << ", " << c.first + c.count << ")");
    HoldFixture f;
    f.hold.drop(f.s, f.table, c.first, c.count);
    EXPECT_EQ(f.hold.begin(), c.begin);
    EXPECT_EQ(f.hold.end(), c.end);
    std::vector<int32_t> table;
    for (int i = 0; i < static_cast<int>(f.table.size()); ++i) {
      const bool dropped = i >= c.first && i < c.first + c.count;
      const int want = (i >= 2 && i < 6 && !dropped) ? 1 : 0;
      EXPECT_EQ(f.s.local_pins(BlockId(f.table[static_cast<size_t>(i)])), want) << "old entry " << i;
      if (!dropped) table.push_back(f.table[static_cast<size_t>(i)]);
    }
    // The renumbered hold covers exactly the pinned entries of the new table.
    for (int k = 0; k < static_cast<int>(table.size()); ++k) {
      EXPECT_EQ(f.s.local_pins(BlockId(table[static_cast<size_t>(k)])), f.hold.covers(k) ? 1 : 0) << "new entry " << k;
    }
    f.hold.release_all(f.s, table);
    EXPECT_EQ(f.s.local_blocks_in_use(), 0);
  }
}

TEST(LocalWindowHold, TruncateUnpinsTheEntriesPastTheNewEnd) {
  HoldFixture f;
  f.hold.truncate(f.s, f.table, 10);  // longer than the hold: nothing
  EXPECT_EQ(f.hold.end(), 6);
  f.hold.truncate(f.s, f.table, 4);
  EXPECT_EQ(f.hold.begin(), 2);
  EXPECT_EQ(f.hold.end(), 4);
  EXPECT_EQ(pins(f.s, f.table), (std::vector<int>{0, 0, 1, 1, 0, 0, 0, 0}));
  f.hold.truncate(f.s, f.table, 1);  // before the hold's begin: empty at the new end
  EXPECT_EQ(f.hold.begin(), 1);
  EXPECT_EQ(f.hold.end(), 1);
  EXPECT_EQ(f.s.local_blocks_in_use(), 0);
  // The sequence grows again from its single entry.
  std::vector<int32_t> table = {f.table[0], 14};
  ASSERT_TRUE(f.hold.extend(f.s, table));
  EXPECT_EQ(pins(f.s, table), (std::vector<int>{0, 1}));
  EXPECT_EQ(f.hold.begin(), 1);
  EXPECT_EQ(f.hold.end(), 2);
}

TEST(LocalWindowHold, WidenPinsTheEntriesBeforeBegin) {
  HoldFixture f;
  ASSERT_TRUE(f.hold.widen(f.s, f.table, 3));  // inside the hold: nothing
  ASSERT_TRUE(f.hold.widen(f.s, f.table, 2));
  EXPECT_EQ(f.hold.begin(), 2);
  ASSERT_TRUE(f.hold.widen(f.s, f.table, 1));
  EXPECT_EQ(f.hold.begin(), 1);
  EXPECT_EQ(pins(f.s, f.table), (std::vector<int>{0, 1, 1, 1, 1, 1, 0, 0}));
  ASSERT_TRUE(f.hold.widen(f.s, f.table, -3));  // clamped to the table's start
  EXPECT_EQ(f.hold.begin(), 0);
  EXPECT_EQ(pins(f.s, f.table), (std::vector<int>{1, 1, 1, 1, 1, 1, 0, 0}));
  f.hold.release_all(f.s, f.table);
  EXPECT_EQ(f.s.local_blocks_in_use(), 0);
}

// Widening onto entries that lost their slots needs free (or retained) ones; when they run out
// widen fails and pins nothing.
TEST(LocalWindowHold, WidenFailsPinningNothingWhenTheSlotsRunOut) {
  KvStorage s(kLayout, KvType::kF32, KvType::kF32, 16, local_options(6));
  LocalWindowHold hold;
  const std::vector<int32_t> table = {3, 7, 1, 9, 4};
  ASSERT_TRUE(hold.extend(s, table));
  hold.release_before(s, table, 12);  // entries 0..2 retained
  // Other sequences take every slot: the free one, then entries 0, 1, 2's.
  for (int b : {12, 13, 14, 15}) ASSERT_TRUE(s.pin_local_block(BlockId(b)));
  EXPECT_EQ(cached(s, table), (std::vector<bool>{false, false, false, true, true}));
  EXPECT_FALSE(hold.widen(s, table, 2));
  EXPECT_EQ(hold.begin(), 3);
  EXPECT_EQ(s.local_blocks_in_use(), 6);
  // One slot back: widening by two entries still fails, pinning nothing.
  s.unpin_local_block(BlockId(12));
  EXPECT_FALSE(hold.widen(s, table, 1));
  EXPECT_EQ(hold.begin(), 3);
  EXPECT_EQ(pins(s, table), (std::vector<int>{0, 0, 0, 1, 1}));
  EXPECT_EQ(s.local_blocks_in_use(), 5);
  // By one entry it succeeds.
  ASSERT_TRUE(hold.widen(s, table, 2));
  EXPECT_EQ(hold.begin(), 2);
  EXPECT_EQ(pins(s, table), (std::vector<int>{0, 0, 1, 1, 1}));
}

// adopt: a prefix-cache hit pins the cached blocks of another sequence's table.
TEST(LocalWindowHold, AdoptPinsCachedEntriesFromFirstBlock) {
  KvStorage s(kLayout, KvType::kF32, KvType::kF32, 16, local_options(6));
  const std::vector<int32_t> table = {3, 7, 1, 9};
  LocalWindowHold first;
  ASSERT_TRUE(first.extend(s, table));
  for (int t = 0; t < 16; ++t) {
    const std::vector<float> x(4, static_cast<float>(t));
    for (int l = 0; l < 2; ++l) s.write_tokens(l, table, t, 1, x.data(), x.data());
  }
  first.release_all(s, table);
  EXPECT_EQ(s.local_blocks_retained(), 4);

  LocalWindowHold hit;
  hit.adopt(s, table, 1);
  EXPECT_EQ(hit.begin(), 1);
  EXPECT_EQ(hit.end(), 4);
  EXPECT_EQ(pins(s, table), (std::vector<int>{0, 1, 1, 1}));
  std::vector<float> k(4), v(4);
  s.read_token(0, BlockId(9), 2, k.data(), v.data());
  EXPECT_EQ(k[0], 14.0f);  // the retained bytes
  LocalWindowHold second_hit;
  second_hit.adopt(s, table, 0);
  EXPECT_EQ(pins(s, table), (std::vector<int>{1, 2, 2, 2}));
  LocalWindowHold past_the_end;
  past_the_end.adopt(s, table, 9);  // clamped: an empty hold at the table's end
  EXPECT_EQ(past_the_end.begin(), 4);
  EXPECT_EQ(past_the_end.end(), 4);
  EXPECT_EQ(pins(s, table), (std::vector<int>{1, 2, 2, 2}));
  second_hit.release_all(s, table);
  hit.release_all(s, table);
  EXPECT_EQ(s.local_blocks_in_use(), 0);
}

TEST(LocalWindowHoldDeathTest, AdoptChecksThatEveryEntryIsCached) {
  KvStorage s(kLayout, KvType::kF32, KvType::kF32, 16, local_options(6));
  const std::vector<int32_t> table = {3, 7, 1, 9};
  LocalWindowHold first;
  ASSERT_TRUE(first.extend(s, table));
  first.release_all(s, table);  // retained, entry 0 first in line
  for (int b : {12, 13, 14}) ASSERT_TRUE(s.pin_local_block(BlockId(b)));  // 2 free slots, then entry 0's
  EXPECT_EQ(cached(s, table), (std::vector<bool>{false, true, true, true}));
  LocalWindowHold hit;
  EXPECT_DEATH(hit.adopt(s, table, 0), "block 3 \\(entry 0\\) lost its local-layer bytes before it was adopted");
  hit.adopt(s, table, 1);
  EXPECT_DEATH(hit.adopt(s, table, 1), "adopt on a hold that pins 3 blocks");
}

TEST(LocalWindowHoldDeathTest, ExtendChecksThatTheTableDidNotShrinkUnreported) {
  KvStorage s(kLayout, KvType::kF32, KvType::kF32, 16, local_options(6));
  LocalWindowHold hold;
  std::vector<int32_t> table = {3, 7, 1};
  ASSERT_TRUE(hold.extend(s, table));
  table.pop_back();
  EXPECT_DEATH((void)hold.extend(s, table), "the table shrank from 3 to 2 entries unreported");
}

// Copy on write of a shared entry: the private copy is pinned before its bytes are copied, the
// shared block unpinned after; entries the hold does not cover need neither.
TEST(LocalWindowHold, PinCopyAndUnpinSwappedFollowTheCoveredEntries) {
  KvStorage s(kLayout, KvType::kF32, KvType::kF32, 16, local_options(6));
  std::vector<int32_t> table = {3, 7, 1, 9};
  LocalWindowHold sharer;
  ASSERT_TRUE(sharer.extend(s, table));
  for (int t = 0; t < 16; ++t) {
    const std::vector<float> x(4, static_cast<float>(t));
    for (int l = 0; l < 2; ++l) s.write_tokens(l, table, t, 1, x.data(), x.data());
  }
  LocalWindowHold hold;
  hold.adopt(s, table, 1);  // a fork whose window starts at entry 1
  EXPECT_EQ(pins(s, table), (std::vector<int>{1, 2, 2, 2}));

  ASSERT_TRUE(hold.pin_copy(s, 2, BlockId(10)));
  EXPECT_EQ(s.local_pins(BlockId(10)), 1);
  s.copy_block(BlockId(1), BlockId(10));
  hold.unpin_swapped(s, 2, BlockId(1));
  table[2] = 10;
  EXPECT_EQ(s.local_pins(BlockId(1)), 1);  // the sharer's
  std::vector<float> k(4), v(4);
  s.read_token(0, BlockId(10), 1, k.data(), v.data());
  EXPECT_EQ(k[0], 9.0f);

  // Entry 0 is outside the hold: no pins move.
  ASSERT_TRUE(hold.pin_copy(s, 0, BlockId(11)));
  EXPECT_EQ(s.local_pins(BlockId(11)), 0);
  hold.unpin_swapped(s, 0, BlockId(3));
  EXPECT_EQ(s.local_pins(BlockId(3)), 1);

  // Out of slots: pin_copy fails and nothing changes.
  ASSERT_TRUE(s.pin_local_block(BlockId(12)));  // 6 slots: 3, 7, 1, 9, 10, 12
  EXPECT_FALSE(hold.pin_copy(s, 3, BlockId(13)));
  EXPECT_EQ(s.local_pins(BlockId(13)), 0);
  EXPECT_EQ(s.local_pins(BlockId(9)), 2);
  EXPECT_EQ(s.local_blocks_in_use(), 6);

  hold.release_all(s, table);
  EXPECT_EQ(pins(s, table), (std::vector<int>{1, 1, 0, 1}));  // 10 gone; 3, 7, 9 the sharer's
  EXPECT_EQ(s.local_pins(BlockId(1)), 1);
}

// release_all unpins the first entry first, so the blocks nearest the sequence's end (the
// ones a later hit's window needs) are the last retained slots to be taken.
TEST(LocalWindowHold, ReleaseAllUnpinsFirstEntryFirst) {
  KvStorage s(kLayout, KvType::kF32, KvType::kF32, 16, local_options(4));
  const std::vector<int32_t> table = {3, 7, 1, 9};
  LocalWindowHold hold;
  ASSERT_TRUE(hold.extend(s, table));
  hold.release_all(s, table);
  EXPECT_EQ(hold.begin(), 0);
  EXPECT_EQ(hold.end(), 0);
  EXPECT_EQ(s.local_blocks_in_use(), 0);
  EXPECT_EQ(s.local_blocks_retained(), 4);
  std::vector<bool> want = {true, true, true, true};
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(s.pin_local_block(BlockId(12 + i)));
    want[static_cast<size_t>(i)] = false;
    EXPECT_EQ(cached(s, table), want) << "after " << i + 1 << " reclaims";
  }
}

// After the window moved, release_all unpins only what the hold still covers.
TEST(LocalWindowHold, ReleaseAllUnpinsOnlyTheHeldRange) {
  HoldFixture f;
  f.hold.release_all(f.s, f.table);
  EXPECT_EQ(f.s.local_blocks_in_use(), 0);
  EXPECT_EQ(f.s.local_blocks_retained(), 8);
  LocalWindowHold again;
  again.release_all(f.s, f.table);  // an empty hold: nothing
}

TEST(LocalWindowHold, EverythingIsANoOpWithoutLocalLayers) {
  KvStorage s(kLayout, KvType::kF32, KvType::kF32, 16);
  ASSERT_FALSE(s.has_local_layers());
  std::vector<int32_t> table = {3, 7, 1, 9};
  LocalWindowHold hold;
  EXPECT_TRUE(hold.extend(s, table));
  hold.release_before(s, table, 9);
  EXPECT_TRUE(hold.widen(s, table, 0));
  hold.drop(s, table, 1, 2);
  hold.truncate(s, table, 1);
  EXPECT_TRUE(hold.pin_copy(s, 0, BlockId(5)));
  hold.unpin_swapped(s, 0, BlockId(3));
  LocalWindowHold hit;
  hit.adopt(s, table, 0);  // nothing is cached in local layers, and nothing needs to be
  hold.release_all(s, table);
  hit.release_all(s, table);
  for (const LocalWindowHold* h : {&hold, &hit}) {
    EXPECT_EQ(h->begin(), 0);
    EXPECT_EQ(h->end(), 0);
  }
  EXPECT_EQ(pins(s, table), (std::vector<int>{0, 0, 0, 0}));
  EXPECT_EQ(s.local_pins(BlockId(5)), 0);
  EXPECT_EQ(s.local_blocks_in_use(), 0);
  // A table that shrank is no concern either.
  table.pop_back();
  EXPECT_TRUE(hold.extend(s, table));
}

}  // namespace
}  // namespace kvlm
