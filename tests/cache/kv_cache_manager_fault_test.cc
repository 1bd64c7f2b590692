// Injected allocation failures (core/fault_injection.h) in the cache: the pool answers "no room"
// with blocks free, and every caller of allocate() undoes what it started.
#include "cache/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvlm {
namespace {

using Site = FaultInjection::Site;

std::vector<int> table_ids(const BlockTable& t) { return {t.block_ids().begin(), t.block_ids().end()}; }

TEST(BlockPoolFault, TheArmedAllocationFailsOnceAndTheNextSucceeds) {
  FaultInjection faults;
  BlockPool pool(4, &faults);
  faults.fail_after(Site::kBlockAllocation, 1);
  EXPECT_EQ(pool.allocate()->value, 0);
  EXPECT_EQ(pool.allocate(), std::nullopt);
  EXPECT_EQ(pool.num_free(), 3);  // the failed call took nothing
  EXPECT_EQ(pool.allocate()->value, 1);
  EXPECT_EQ(faults.num_fired(Site::kBlockAllocation), 1);
  EXPECT_EQ(faults.num_fired(Site::kStepForward), 0);
}

TEST(KvCacheManagerFault, AReserveFailingPartWayGivesBackWhatItTook) {
  FaultInjection faults;
  KvCacheManager m(16, 4, &faults);
  const SeqId s = m.create_sequence();
  ASSERT_TRUE(m.reserve(s, 6));  // blocks 0, 1
  m.append(s, 6);
  faults.fail_after(Site::kBlockAllocation, 2);  // 20 more tokens need 4 blocks: the third fails
  EXPECT_FALSE(m.reserve(s, 20));
  EXPECT_EQ(faults.num_fired(Site::kBlockAllocation), 1);
  EXPECT_EQ(table_ids(m.table(s)), (std::vector<int>{0, 1}));
  EXPECT_EQ(m.table(s).num_tokens(), 6);
  EXPECT_EQ(m.num_used_blocks(), 2);
  m.check_invariants();
  EXPECT_TRUE(m.reserve(s, 20));  // the same request succeeds once the fault is spent
  EXPECT_EQ(m.table(s).num_blocks(), 7);
  m.free_sequence(s);
  m.check_invariants();
  EXPECT_EQ(m.num_used_blocks(), 0);
}

TEST(KvCacheManagerFault, AFailedCopyBeforeWriteLeavesTheSharedBlockShared) {
  FaultInjection faults;
  KvCacheManager m(8, 4, &faults);
  const SeqId a = m.create_sequence();
  ASSERT_TRUE(m.reserve(a, 6));
  m.append(a, 6);
  const SeqId b = m.fork_sequence(a);
  faults.fail_after(Site::kBlockAllocation, 0);
  EXPECT_FALSE(m.make_block_exclusive(b, 1).ok());
  EXPECT_EQ(m.block_ref_count(b, 1), 2);
  EXPECT_EQ(table_ids(m.table(a)), table_ids(m.table(b)));
  m.check_invariants();
  m.free_sequence(a);
  m.free_sequence(b);
  EXPECT_EQ(m.num_used_blocks(), 0);
}

}  // namespace
}  // namespace kvlm
