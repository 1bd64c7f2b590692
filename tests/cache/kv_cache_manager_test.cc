#include "cache/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

namespace kvlm {
namespace {

std::vector<int> table_ids(const BlockTable& t) { return {t.block_ids().begin(), t.block_ids().end()}; }

std::vector<int> free_ids(const KvCacheManager& m) {
  std::vector<int> out;
  for (BlockId b : m.pool().free_queue()) out.push_back(b.value);
  return out;
}

TEST(KvCacheManager, ReserveAllocatesExactlyTheMissingBlocks) {
  KvCacheManager m(8, 4);
  const SeqId s = m.create_sequence();
  EXPECT_EQ(m.num_sequences(), 1);
  EXPECT_EQ(m.block_size(), 4);
  EXPECT_EQ(m.num_blocks(), 8);
  EXPECT_TRUE(m.reserve(s, 5));  // 5 tokens → 2 blocks
  EXPECT_EQ(table_ids(m.table(s)), (std::vector<int>{0, 1}));
  EXPECT_EQ(m.num_free_blocks(), 6);
  EXPECT_EQ(m.num_used_blocks(), 2);
  EXPECT_EQ(m.table(s).num_tokens(), 0);
  EXPECT_TRUE(m.reserve(s, 8));  // still fits in 2 blocks: nothing new
  EXPECT_EQ(m.num_used_blocks(), 2);
  m.append(s, 5);
  EXPECT_EQ(m.table(s).num_tokens(), 5);
  EXPECT_TRUE(m.reserve(s, 3));  // 8 tokens fit
  EXPECT_EQ(m.num_used_blocks(), 2);
  EXPECT_TRUE(m.reserve(s, 4));  // 9 tokens: a third block
  EXPECT_EQ(table_ids(m.table(s)), (std::vector<int>{0, 1, 2}));
  m.append(s, 4);
  EXPECT_EQ(m.table(s).num_tokens(), 9);
  EXPECT_EQ(m.table(s).slot(8).block.value, 2);
  EXPECT_EQ(m.table(s).slot(8).offset, 0);
  EXPECT_TRUE(m.reserve(s, 0));
  EXPECT_EQ(m.num_used_blocks(), 3);
  EXPECT_EQ(m.blocks_for_tokens(9), 3);
  EXPECT_EQ(m.blocks_for_tokens(0), 0);
}

TEST(KvCacheManager, FailedReserveChangesNothing) {
  KvCacheManager m(5, 2);
  const SeqId a = m.create_sequence();
  const SeqId b = m.create_sequence();
  ASSERT_TRUE(m.reserve(a, 5));  // blocks 0 1 2, capacity 6
  m.append(a, 5);
  ASSERT_TRUE(m.reserve(b, 1));  // block 3
  EXPECT_EQ(free_ids(m), (std::vector<int>{4}));

  EXPECT_FALSE(m.reserve(b, 5));  // 3 blocks: 2 missing, 1 free
  EXPECT_FALSE(m.reserve(a, 4));  // 9 tokens → 5 blocks: 2 missing, 1 free
  EXPECT_EQ(table_ids(m.table(a)), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(table_ids(m.table(b)), (std::vector<int>{3}));
  EXPECT_EQ(m.table(a).num_tokens(), 5);
  EXPECT_EQ(m.table(b).num_tokens(), 0);
  EXPECT_EQ(free_ids(m), (std::vector<int>{4}));
  for (int id = 0; id < 4; ++id) EXPECT_EQ(m.pool().ref_count(BlockId(id)), 1);

  EXPECT_TRUE(m.reserve(a, 3));  // 8 tokens → 4 blocks: exactly the last free one
  EXPECT_EQ(table_ids(m.table(a)), (std::vector<int>{0, 1, 2, 4}));
  EXPECT_EQ(m.num_free_blocks(), 0);
  EXPECT_FALSE(m.reserve(b, 3));
}

TEST(KvCacheManager, FreeSequenceReturnsBlocksLastFirst) {
  KvCacheManager m(6, 1);
  const SeqId a = m.create_sequence();
  const SeqId b = m.create_sequence();
  ASSERT_TRUE(m.reserve(a, 3));  // 0 1 2
  ASSERT_TRUE(m.reserve(b, 2));  // 3 4
  m.append(a, 3);
  m.append(b, 1);
  m.free_sequence(a);
  EXPECT_EQ(free_ids(m), (std::vector<int>{5, 2, 1, 0}));
  EXPECT_EQ(m.num_sequences(), 1);
  // The freed tail block comes back before the freed head block.
  const SeqId c = m.create_sequence();
  ASSERT_TRUE(m.reserve(c, 2));
  EXPECT_EQ(table_ids(m.table(c)), (std::vector<int>{5, 2}));
  m.free_sequence(b);
  m.free_sequence(c);
  EXPECT_EQ(free_ids(m), (std::vector<int>{1, 0, 4, 3, 2, 5}));
  EXPECT_EQ(m.num_free_blocks(), 6);
  EXPECT_EQ(m.num_sequences(), 0);
  EXPECT_NE(c.value, a.value);  // ids are never reused
}

TEST(KvCacheManagerDeathTest, MisuseAborts) {
  KvCacheManager m(4, 4);
  const SeqId s = m.create_sequence();
  ASSERT_TRUE(m.reserve(s, 4));
  EXPECT_DEATH(m.append(s, 5), "exceeds the reserved capacity 4");
  m.free_sequence(s);
  EXPECT_DEATH(m.table(s), "unknown sequence 0");
  EXPECT_DEATH(m.free_sequence(s), "unknown sequence 0");
  EXPECT_DEATH((void)m.reserve(SeqId(42), 1), "unknown sequence 42");
}

// Random interleavings of create / reserve / append / free over a small pool: the
// books always balance, reserve fails exactly when the pool is short (and then
// changes nothing), and once every sequence is freed every block is back.
void run_random_interleaving(uint32_t seed, int num_blocks, int block_size) {
  SCOPED_TRACE(testing::Message() << "seed " << seed << " blocks " << num_blocks << " block_size " << block_size);
  std::mt19937 rng(seed);
  KvCacheManager m(num_blocks, block_size);
  std::vector<SeqId> live;
  int failures = 0;

  auto check_books = [&] {
    std::set<int> seen;
    int used = 0;
    for (SeqId s : live) {
      const BlockTable& t = m.table(s);
      ASSERT_LE(t.num_tokens(), t.capacity());
      for (int id : t.block_ids()) {
        ASSERT_TRUE(seen.insert(id).second) << "block " << id << " in two tables";
        ASSERT_EQ(m.pool().ref_count(BlockId(id)), 1);
      }
      used += t.num_blocks();
    }
    ASSERT_EQ(used, m.num_used_blocks());
    ASSERT_EQ(m.num_free_blocks() + m.num_used_blocks(), num_blocks);
    for (BlockId b : m.pool().free_queue()) ASSERT_EQ(m.pool().ref_count(b), 0);
    ASSERT_EQ(m.num_sequences(), static_cast<int>(live.size()));
  };

  for (int step = 0; step < 3000; ++step) {
    const int op = std::uniform_int_distribution<int>(0, 9)(rng);
    if (op == 0 || live.empty()) {
      if (live.size() < 12) live.push_back(m.create_sequence());
    } else if (op == 1) {
      const size_t i = std::uniform_int_distribution<size_t>(0, live.size() - 1)(rng);
      m.free_sequence(live[i]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      const SeqId s = live[std::uniform_int_distribution<size_t>(0, live.size() - 1)(rng)];
      const int n = std::uniform_int_distribution<int>(0, 3 * block_size)(rng);
      const std::vector<int> before_ids = table_ids(m.table(s));
      const int before_tokens = m.table(s).num_tokens();
      const std::vector<int> before_free = free_ids(m);
      const int missing = std::max(0, m.blocks_for_tokens(before_tokens + n) - static_cast<int>(before_ids.size()));
      const bool ok = m.reserve(s, n);
      ASSERT_EQ(ok, missing <= static_cast<int>(before_free.size()));
      if (ok) {
        // The missing blocks come from the front of the free queue, in order.
        std::vector<int> expected = before_ids;
        expected.insert(expected.end(), before_free.begin(), before_free.begin() + missing);
        ASSERT_EQ(table_ids(m.table(s)), expected);
        m.append(s, std::uniform_int_distribution<int>(0, n)(rng));
      } else {
        ++failures;
        ASSERT_EQ(table_ids(m.table(s)), before_ids);
        ASSERT_EQ(m.table(s).num_tokens(), before_tokens);
        ASSERT_EQ(free_ids(m), before_free);
      }
    }
    check_books();
    if (testing::Test::HasFatalFailure()) return;
  }
  EXPECT_GT(failures, 0) << "the pool never ran short: the test is too gentle";
  for (SeqId s : live) m.free_sequence(s);
  live.clear();
  check_books();
  EXPECT_EQ(m.num_free_blocks(), num_blocks);
  EXPECT_EQ(m.num_used_blocks(), 0);
  for (int id = 0; id < num_blocks; ++id) EXPECT_EQ(m.pool().ref_count(BlockId(id)), 0);
}

TEST(KvCacheManager, RandomInterleavingsKeepTheBooksBalanced) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    run_random_interleaving(seed, 24, 1);
    run_random_interleaving(seed, 32, 4);
    run_random_interleaving(seed, 40, 16);
  }
}

}  // namespace
}  // namespace kvlm
