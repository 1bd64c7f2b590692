// KvCacheManager's eviction and sharing bookkeeping: drop_blocks, truncate, fork_sequence, make_block_exclusive.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include "cache/kv_cache_manager.h"

namespace kvlm {
namespace {

std::vector<int> table_ids(const KvCacheManager& m, SeqId s) {
  const auto& ids = m.table(s).block_ids();
  return {ids.begin(), ids.end()};
}

std::vector<int> values(const std::vector<BlockId>& blocks) {
  std::vector<int> out;
  for (BlockId b : blocks) out.push_back(b.value);
  return out;
}

std::vector<int> free_ids(const KvCacheManager& m) { return values(m.pool().free_queue()); }

// A sequence of `tokens` tokens in a pool of 10 blocks of 4: blocks 0, 1, … in order.
SeqId filled(KvCacheManager& m, int tokens) {
  const SeqId s = m.create_sequence();
  EXPECT_TRUE(m.reserve(s, tokens));
  m.append(s, tokens);
  return s;
}

TEST(KvCacheManagerEviction, DropBlocksRemovesFullBlocksFromTheMiddle) {
  KvCacheManager m(10, 4);
  const SeqId s = filled(m, 18);  // blocks 0..4, the last holding 2 tokens
  // Blocks 1 and 2 (tokens 4..11) go; tokens 12.. move down by 8.
  EXPECT_EQ(values(m.drop_blocks(s, 1, 2)), (std::vector<int>{2, 1}));  // last first
  EXPECT_EQ(table_ids(m, s), (std::vector<int>{0, 3, 4}));
  EXPECT_EQ(m.table(s).num_tokens(), 10);
  EXPECT_EQ(m.table(s).slot(4).block.value, 3);  // what was token 12
  EXPECT_EQ(free_ids(m), (std::vector<int>{5, 6, 7, 8, 9, 2, 1}));
  EXPECT_EQ(m.num_free_blocks(), 7);
  // The first block, and an empty range.
  EXPECT_EQ(values(m.drop_blocks(s, 0, 1)), (std::vector<int>{0}));
  EXPECT_TRUE(m.drop_blocks(s, 1, 0).empty());
  EXPECT_EQ(table_ids(m, s), (std::vector<int>{3, 4}));
  EXPECT_EQ(m.table(s).num_tokens(), 6);
}

TEST(KvCacheManagerEviction, TruncateReleasesTheBlocksPastTheNewEnd) {
  KvCacheManager m(10, 4);
  const SeqId s = filled(m, 10);  // blocks 0 1 2
  ASSERT_TRUE(m.reserve(s, 6));   // block 3 reserved, not appended
  EXPECT_EQ(values(m.truncate(s, 10)), (std::vector<int>{3}));  // the reserved, unused block goes
  EXPECT_EQ(table_ids(m, s), (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(m.truncate(s, 9).empty());  // still 3 blocks
  EXPECT_EQ(m.table(s).num_tokens(), 9);
  EXPECT_EQ(values(m.truncate(s, 3)), (std::vector<int>{2, 1}));
  EXPECT_EQ(table_ids(m, s), (std::vector<int>{0}));
  EXPECT_EQ(m.table(s).num_tokens(), 3);
  EXPECT_EQ(values(m.truncate(s, 0)), (std::vector<int>{0}));
  EXPECT_EQ(m.table(s).num_blocks(), 0);
  EXPECT_EQ(m.num_free_blocks(), 10);
  EXPECT_EQ(free_ids(m), (std::vector<int>{4, 5, 6, 7, 8, 9, 3, 2, 1, 0}));
}

// Forks share every block; a shared block is freed only when its last holder lets go, and
// make_block_exclusive swaps a shared block for a fresh one in one table only.
TEST(KvCacheManagerEviction, ForkSharesBlocksUntilMadeExclusive) {
  KvCacheManager m(6, 4);
  const SeqId a = filled(m, 7);  // blocks 0 1
  const SeqId b = m.fork_sequence(a);
  EXPECT_NE(a, b);
  EXPECT_EQ(table_ids(m, b), (std::vector<int>{0, 1}));
  EXPECT_EQ(m.table(b).num_tokens(), 7);
  EXPECT_EQ(m.block_ref_count(a, 0), 2);
  EXPECT_EQ(m.block_ref_count(b, 1), 2);
  EXPECT_EQ(m.num_free_blocks(), 4);

  // b writes into its tail: block 1 is copied to the front of the free queue, block 2.
  const Result<std::optional<BlockSwap>> swap = m.make_block_exclusive(b, 1);
  ASSERT_TRUE(swap.ok()) << swap.status().message();
  ASSERT_TRUE(swap->has_value());
  EXPECT_EQ((*swap)->shared.value, 1);
  EXPECT_EQ((*swap)->copy.value, 2);
  EXPECT_EQ(table_ids(m, b), (std::vector<int>{0, 2}));
  EXPECT_EQ(table_ids(m, a), (std::vector<int>{0, 1}));
  EXPECT_EQ(m.block_ref_count(a, 1), 1);
  EXPECT_EQ(m.block_ref_count(b, 1), 1);
  EXPECT_EQ(m.block_ref_count(b, 0), 2);
  // Already exclusive: nothing to do.
  const Result<std::optional<BlockSwap>> again = m.make_block_exclusive(b, 1);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->has_value());

  // a drops its shared first block: b still holds it, so nothing is freed.
  EXPECT_TRUE(m.drop_blocks(a, 0, 1).empty());
  EXPECT_EQ(m.block_ref_count(b, 0), 1);
  EXPECT_EQ(table_ids(m, a), (std::vector<int>{1}));
  EXPECT_EQ(m.table(a).num_tokens(), 3);
  // Truncating b to nothing frees both of its blocks, now exclusive.
  EXPECT_EQ(values(m.truncate(b, 0)), (std::vector<int>{2, 0}));
  m.free_sequence(a);
  m.free_sequence(b);
  EXPECT_EQ(m.num_free_blocks(), 6);
}

TEST(KvCacheManagerEviction, MakeExclusiveFailsCleanlyWhenThePoolIsFull) {
  KvCacheManager m(3, 2);
  const SeqId a = filled(m, 4);  // blocks 0 1
  const SeqId b = m.fork_sequence(a);
  const SeqId c = filled(m, 1);  // block 2: the pool is full
  const Result<std::optional<BlockSwap>> swap = m.make_block_exclusive(b, 0);
  ASSERT_FALSE(swap.ok());
  EXPECT_NE(swap.status().message().find("no free KV block"), std::string::npos) << swap.status().message();
  EXPECT_NE(swap.status().message().find("block 0"), std::string::npos) << swap.status().message();
  EXPECT_EQ(table_ids(m, b), (std::vector<int>{0, 1}));
  EXPECT_EQ(m.block_ref_count(b, 0), 2);
  m.free_sequence(c);
  const Result<std::optional<BlockSwap>> retry = m.make_block_exclusive(b, 0);
  ASSERT_TRUE(retry.ok());
  ASSERT_TRUE(retry->has_value());
  EXPECT_EQ((*retry)->copy.value, 2);
}

TEST(KvCacheManagerEvictionDeathTest, MisuseAborts) {
  KvCacheManager m(8, 4);
  const SeqId s = filled(m, 10);  // 2 full blocks and a partial one
  EXPECT_DEATH(m.drop_blocks(s, 1, 2), "not inside its 2 full blocks");
  EXPECT_DEATH(m.drop_blocks(s, -1, 1), "not inside");
  EXPECT_DEATH(m.truncate(s, 11), "truncate to 11 tokens, it has 10");
  EXPECT_DEATH(m.block_ref_count(s, 3), "out of range");
  EXPECT_DEATH((void)m.make_block_exclusive(s, 5), "out of range");
  EXPECT_DEATH(m.fork_sequence(SeqId(9)), "unknown sequence 9");
}

// Random create / reserve+append / fork / drop / truncate / make_exclusive / free against a
// plain model (each sequence's ids and token count): tables and freed ids match the model,
// every ref count equals the number of tables holding the block, free blocks are exactly
// those held by none, and once everything is freed the pool is full again.
void run_random_ops(uint32_t seed, int num_blocks, int block_size) {
  SCOPED_TRACE(testing::Message() << "seed " << seed << " blocks " << num_blocks << " block_size " << block_size);
  std::mt19937 rng(seed);
  KvCacheManager m(num_blocks, block_size);
  struct Model {
    std::vector<int> ids;
    int tokens = 0;
  };
  std::map<int, Model> model;  // by SeqId value
  std::map<std::string, int> counts;
  auto pick = [&] {
    auto it = model.begin();
    std::advance(it, std::uniform_int_distribution<int>(0, static_cast<int>(model.size()) - 1)(rng));
    return it;
  };
  auto refs = [&] {
    std::vector<int> r(static_cast<size_t>(num_blocks), 0);
    for (const auto& [seq, md] : model) {
      for (int id : md.ids) ++r[static_cast<size_t>(id)];
    }
    return r;
  };
  // The ids of `released` (in release order) whose count in the model drops to 0.
  auto expected_freed = [&](const std::vector<int>& released) {
    std::vector<int> r = refs(), freed;
    for (int id : released) {
      if (--r[static_cast<size_t>(id)] == 0) freed.push_back(id);
    }
    return freed;
  };

  for (int step = 0; step < 3000; ++step) {
    const int op = model.empty() ? 0 : std::uniform_int_distribution<int>(0, 9)(rng);
    if (op == 0) {
      if (model.size() < 10) model[m.create_sequence().value] = {};
      ++counts["create"];
    } else if (op <= 3) {
      auto it = pick();
      const SeqId s(it->first);
      const int n = std::uniform_int_distribution<int>(0, 3 * block_size)(rng);
      if (m.reserve(s, n)) {
        const int appended = std::uniform_int_distribution<int>(0, n)(rng);
        m.append(s, appended);
        it->second.ids = table_ids(m, s);
        it->second.tokens += appended;
        ++counts["reserve"];
      }
    } else if (op == 4) {
      if (model.size() < 10) {
        auto it = pick();
        const SeqId f = m.fork_sequence(SeqId(it->first));
        model[f.value] = it->second;
        ++counts["fork"];
      }
    } else if (op == 5) {
      auto it = pick();
      Model& md = it->second;
      const int full = md.tokens / block_size;
      if (full > 0) {
        const int first = std::uniform_int_distribution<int>(0, full - 1)(rng);
        const int count = std::uniform_int_distribution<int>(0, full - first)(rng);
        std::vector<int> released(md.ids.begin() + first, md.ids.begin() + first + count);
        std::reverse(released.begin(), released.end());
        const std::vector<int> want = expected_freed(released);
        ASSERT_EQ(values(m.drop_blocks(SeqId(it->first), first, count)), want);
        md.ids.erase(md.ids.begin() + first, md.ids.begin() + first + count);
        md.tokens -= count * block_size;
        ++counts["drop"];
      }
    } else if (op == 6) {
      auto it = pick();
      Model& md = it->second;
      const int n = std::uniform_int_distribution<int>(0, md.tokens)(rng);
      const size_t keep = static_cast<size_t>(m.blocks_for_tokens(n));
      std::vector<int> released(md.ids.begin() + static_cast<std::ptrdiff_t>(keep), md.ids.end());
      std::reverse(released.begin(), released.end());
      const std::vector<int> want = expected_freed(released);
      ASSERT_EQ(values(m.truncate(SeqId(it->first), n)), want);
      md.ids.resize(keep);
      md.tokens = n;
      ++counts["truncate"];
    } else if (op <= 8) {
      auto it = pick();
      Model& md = it->second;
      if (!md.ids.empty()) {
        const int idx = std::uniform_int_distribution<int>(0, static_cast<int>(md.ids.size()) - 1)(rng);
        const int rc = refs()[static_cast<size_t>(md.ids[static_cast<size_t>(idx)])];
        const std::vector<int> free_before = free_ids(m);
        const Result<std::optional<BlockSwap>> swap = m.make_block_exclusive(SeqId(it->first), idx);
        if (rc == 1) {
          ASSERT_TRUE(swap.ok());
          ASSERT_FALSE(swap->has_value());
        } else if (free_before.empty()) {
          ASSERT_FALSE(swap.ok());
          ++counts["exclusive_failed"];
        } else {
          ASSERT_TRUE(swap.ok());
          ASSERT_TRUE(swap->has_value());
          ASSERT_EQ((*swap)->shared.value, md.ids[static_cast<size_t>(idx)]);
          ASSERT_EQ((*swap)->copy.value, free_before.front());
          md.ids[static_cast<size_t>(idx)] = (*swap)->copy.value;
          ++counts["exclusive_copied"];
        }
      }
    } else {
      auto it = pick();
      m.free_sequence(SeqId(it->first));
      model.erase(it);
      ++counts["free"];
    }

    // The books.
    const std::vector<int> r = refs();
    int used = 0;
    for (const auto& [seq, md] : model) {
      ASSERT_EQ(table_ids(m, SeqId(seq)), md.ids);
      ASSERT_EQ(m.table(SeqId(seq)).num_tokens(), md.tokens);
      for (size_t idx = 0; idx < md.ids.size(); ++idx) {
        ASSERT_EQ(m.block_ref_count(SeqId(seq), static_cast<int>(idx)), r[static_cast<size_t>(md.ids[idx])]);
      }
    }
    for (int id = 0; id < num_blocks; ++id) {
      ASSERT_EQ(m.pool().ref_count(BlockId(id)), r[static_cast<size_t>(id)]) << "block " << id;
      used += r[static_cast<size_t>(id)] > 0 ? 1 : 0;
    }
    ASSERT_EQ(m.num_used_blocks(), used);
    ASSERT_EQ(m.num_sequences(), static_cast<int>(model.size()));
  }
  // Every kind of operation happened, including a copy refused for lack of room.
  for (const char* kind : {"create", "reserve", "fork", "drop", "truncate", "exclusive_copied", "exclusive_failed",
                           "free"}) {
    EXPECT_GT(counts[kind], 0) << kind;
  }
  for (const auto& [seq, md] : model) m.free_sequence(SeqId(seq));
  EXPECT_EQ(m.num_free_blocks(), num_blocks);
  EXPECT_EQ(m.num_sequences(), 0);
  for (int id = 0; id < num_blocks; ++id) EXPECT_EQ(m.pool().ref_count(BlockId(id)), 0);
}

TEST(KvCacheManagerEviction, RandomOpsKeepRefCountsConsistentAndLeakNothing) {
  for (uint32_t seed : {11u, 12u}) {
    run_random_ops(seed, 16, 1);
    run_random_ops(seed, 24, 4);
    run_random_ops(seed, 32, 16);
  }
}

}  // namespace
}  // namespace kvlm
