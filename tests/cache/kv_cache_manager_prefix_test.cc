// KvCacheManager's prefix caching: publish, match, attach, cached-free blocks and their eviction.
#include <gtest/gtest.h>

#include <string_view>
#include <vector>

#include "cache/cache_test_util.h"
#include "cache/kv_cache_manager.h"

namespace kvlm {
namespace {

constexpr std::string_view kIdentity = "test-model;kv=f16;block=4";

using testing::free_ids;
using testing::table_ids;
using testing::values;

// A prompt's tokens and its chain hashes, as the engine computes them per request.
struct Prompt {
  std::vector<TokenId> tokens;
  std::vector<BlockHash> hashes;
  int block_size;

  std::span<const TokenId> block(int i) const {
    return std::span<const TokenId>(tokens).subspan(static_cast<size_t>(i * block_size),
                                                    static_cast<size_t>(block_size));
  }
};

Prompt make_prompt(int first_token, int num_tokens, int block_size, std::string_view salt = "") {
  Prompt p{{}, {}, block_size};
  for (int i = 0; i < num_tokens; ++i) p.tokens.push_back(first_token + i);
  p.hashes = chain_block_hashes(prefix_root_hash(kIdentity, salt), p.tokens, block_size);
  return p;
}

std::vector<int> match(const KvCacheManager& m, const Prompt& p) { return values(m.match_prefix(p.hashes, p.tokens)); }

// A request computed from scratch: reserve, append, and publish every full block.
SeqId computed(KvCacheManager& m, const Prompt& p) {
  const SeqId s = m.create_sequence();
  EXPECT_TRUE(m.reserve(s, static_cast<int>(p.tokens.size())));
  m.append(s, static_cast<int>(p.tokens.size()));
  for (int i = 0; i < static_cast<int>(p.hashes.size()); ++i) {
    EXPECT_TRUE(m.publish_block(s, i, p.hashes[static_cast<size_t>(i)], p.block(i))) << "block " << i;
  }
  return s;
}

// A request served from the cache: the matched blocks, then its own for the rest.
SeqId attached(KvCacheManager& m, const Prompt& p) {
  const SeqId s = m.create_sequence();
  const std::vector<BlockId> hit = m.match_prefix(p.hashes, p.tokens);
  m.attach_prefix(s, hit);
  return s;
}

TEST(KvCacheManagerPrefix, PublishedBlocksAreSharedWithALaterRequest) {
  KvCacheManager m(8, 4);
  const Prompt p = make_prompt(100, 10, 4);  // 2 full blocks and 2 tokens
  const SeqId a = m.create_sequence();
  ASSERT_TRUE(m.reserve(a, 10));  // blocks 0 1 2
  m.append(a, 10);
  EXPECT_TRUE(match(m, p).empty());  // nothing published yet
  EXPECT_TRUE(m.publish_block(a, 0, p.hashes[0], p.block(0)));
  EXPECT_TRUE(m.publish_block(a, 1, p.hashes[1], p.block(1)));
  EXPECT_EQ(m.num_published_blocks(), 2);
  EXPECT_EQ(m.prefix_stats().blocks_published, 2);
  EXPECT_TRUE(m.is_published(BlockId(1)));
  EXPECT_FALSE(m.is_published(BlockId(2)));
  EXPECT_EQ(match(m, p), (std::vector<int>{0, 1}));

  const SeqId b = attached(m, p);
  EXPECT_EQ(table_ids(m, b), (std::vector<int>{0, 1}));
  EXPECT_EQ(m.table(b).num_tokens(), 8);
  EXPECT_EQ(m.block_ref_count(b, 0), 2);
  EXPECT_EQ(m.block_ref_count(b, 1), 2);
  EXPECT_EQ(m.prefix_stats().prefix_hit_blocks, 2);
  EXPECT_EQ(m.num_free_blocks(), 5);
  EXPECT_EQ(m.num_cached_free_blocks(), 0);
  m.check_invariants();
  ASSERT_TRUE(m.reserve(b, 2));  // its own tail: block 3
  m.append(b, 2);
  EXPECT_EQ(table_ids(m, b), (std::vector<int>{0, 1, 3}));

  m.free_sequence(a);  // 2 is free; 0 and 1 are still b's
  EXPECT_EQ(free_ids(m), (std::vector<int>{4, 5, 6, 7, 2}));
  EXPECT_EQ(m.num_cached_free_blocks(), 0);
  m.check_invariants();
  m.free_sequence(b);  // now 1 and 0 are cached-free, tail first
  EXPECT_EQ(free_ids(m), (std::vector<int>{4, 5, 6, 7, 2, 3, 1, 0}));
  EXPECT_EQ(m.num_cached_free_blocks(), 2);
  EXPECT_EQ(m.num_published_blocks(), 2);
  EXPECT_EQ(m.num_free_blocks(), 8);
  EXPECT_EQ(match(m, p), (std::vector<int>{0, 1}));
  m.check_invariants();
}

TEST(KvCacheManagerPrefix, AttachRevivesCachedFreeBlocks) {
  KvCacheManager m(8, 4);
  m.free_sequence(computed(m, make_prompt(100, 10, 4)));  // blocks 0 1 published, 2 not
  EXPECT_EQ(free_ids(m), (std::vector<int>{3, 4, 5, 6, 7, 2, 1, 0}));
  EXPECT_EQ(m.num_cached_free_blocks(), 2);

  const Prompt longer = make_prompt(100, 14, 4);  // the same 8 tokens, then others
  EXPECT_EQ(match(m, longer), (std::vector<int>{0, 1}));
  const SeqId c = attached(m, longer);
  EXPECT_EQ(table_ids(m, c), (std::vector<int>{0, 1}));
  EXPECT_EQ(m.block_ref_count(c, 0), 1);
  EXPECT_EQ(m.block_ref_count(c, 1), 1);
  EXPECT_EQ(free_ids(m), (std::vector<int>{3, 4, 5, 6, 7, 2}));  // taken out, the rest in order
  EXPECT_EQ(m.num_cached_free_blocks(), 0);
  EXPECT_EQ(m.prefix_stats().prefix_hit_blocks, 2);
  EXPECT_EQ(m.prefix_stats().blocks_evicted, 0);
  m.check_invariants();

  ASSERT_TRUE(m.reserve(c, 6));  // tokens 8..13: blocks 3 4
  m.append(c, 6);
  EXPECT_EQ(table_ids(m, c), (std::vector<int>{0, 1, 3, 4}));
  EXPECT_TRUE(m.publish_block(c, 2, longer.hashes[2], longer.block(2)));
  EXPECT_EQ(match(m, longer), (std::vector<int>{0, 1, 3}));
  m.check_invariants();
}

TEST(KvCacheManagerPrefix, PlainFreeBlocksAreReusedBeforeCachedFreeOnes) {
  KvCacheManager m(6, 2);
  const Prompt p = make_prompt(0, 4, 2);
  m.free_sequence(computed(m, p));  // 0 1 published and cached-free
  EXPECT_EQ(free_ids(m), (std::vector<int>{2, 3, 4, 5, 1, 0}));
  const SeqId b = m.create_sequence();
  ASSERT_TRUE(m.reserve(b, 8));
  EXPECT_EQ(table_ids(m, b), (std::vector<int>{2, 3, 4, 5}));
  EXPECT_EQ(m.prefix_stats().blocks_evicted, 0);
  EXPECT_EQ(m.num_cached_free_blocks(), 2);
  m.append(b, 8);
  ASSERT_TRUE(m.reserve(b, 1));  // only cached-free blocks left: the tail one goes
  EXPECT_EQ(table_ids(m, b), (std::vector<int>{2, 3, 4, 5, 1}));
  EXPECT_EQ(m.prefix_stats().blocks_evicted, 1);
  EXPECT_FALSE(m.is_published(BlockId(1)));
  EXPECT_EQ(m.num_cached_free_blocks(), 1);
  EXPECT_EQ(match(m, p), (std::vector<int>{0}));
  m.check_invariants();
}

// A finished chain is evicted from its tail: the head, shared by the most prompts, lasts.
TEST(KvCacheManagerPrefix, CachedFreeChainIsEvictedTailFirst) {
  KvCacheManager m(4, 2);
  const Prompt p = make_prompt(0, 8, 2);
  m.free_sequence(computed(m, p));  // all 4 blocks published
  EXPECT_EQ(free_ids(m), (std::vector<int>{3, 2, 1, 0}));
  EXPECT_EQ(m.num_cached_free_blocks(), 4);

  const SeqId b = m.create_sequence();
  ASSERT_TRUE(m.reserve(b, 2));
  EXPECT_EQ(table_ids(m, b), (std::vector<int>{3}));
  EXPECT_FALSE(m.is_published(BlockId(3)));
  EXPECT_EQ(m.prefix_stats().blocks_evicted, 1);
  EXPECT_EQ(m.num_cached_free_blocks(), 3);
  EXPECT_EQ(match(m, p), (std::vector<int>{0, 1, 2}));
  m.append(b, 2);
  ASSERT_TRUE(m.reserve(b, 2));
  EXPECT_EQ(table_ids(m, b), (std::vector<int>{3, 2}));
  EXPECT_EQ(m.prefix_stats().blocks_evicted, 2);
  EXPECT_EQ(match(m, p), (std::vector<int>{0, 1}));
  EXPECT_EQ(m.num_published_blocks(), 2);

  const SeqId c = attached(m, p);  // the surviving head is a hit
  EXPECT_EQ(table_ids(m, c), (std::vector<int>{0, 1}));
  EXPECT_EQ(m.num_free_blocks(), 0);
  EXPECT_EQ(m.num_cached_free_blocks(), 0);
  EXPECT_FALSE(m.reserve(c, 1));  // full: no room is a value
  m.check_invariants();
}

TEST(KvCacheManagerPrefix, MakeExclusiveUnpublishesOnlyAnExclusiveBlock) {
  KvCacheManager m(6, 4);
  const Prompt p = make_prompt(1, 4, 4);
  const SeqId a = computed(m, p);  // block 0
  const SeqId b = m.fork_sequence(a);
  // Shared: b gets a copy, the published original stays published for a.
  const Result<std::optional<BlockSwap>> swap = m.make_block_exclusive(b, 0);
  ASSERT_TRUE(swap.ok());
  ASSERT_TRUE(swap->has_value());
  EXPECT_EQ((*swap)->shared.value, 0);
  EXPECT_EQ((*swap)->copy.value, 1);
  EXPECT_TRUE(m.is_published(BlockId(0)));
  EXPECT_FALSE(m.is_published(BlockId(1)));
  EXPECT_EQ(m.prefix_stats().blocks_unpublished, 0);
  EXPECT_EQ(match(m, p), (std::vector<int>{0}));
  m.check_invariants();
  // Exclusive: no copy, but the block is about to change, so it leaves the index.
  const Result<std::optional<BlockSwap>> none = m.make_block_exclusive(a, 0);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  EXPECT_FALSE(m.is_published(BlockId(0)));
  EXPECT_EQ(m.prefix_stats().blocks_unpublished, 1);
  EXPECT_TRUE(match(m, p).empty());
  EXPECT_EQ(m.num_published_blocks(), 0);
  m.free_sequence(a);
  EXPECT_EQ(m.num_cached_free_blocks(), 0);
  m.check_invariants();
}

TEST(KvCacheManagerPrefix, PublishingTheSameContentTwiceKeepsTheFirst) {
  KvCacheManager m(8, 4);
  const Prompt p = make_prompt(50, 8, 4);
  // Two requests with one prompt in the same batch: each computed its own blocks.
  const SeqId a = m.create_sequence();
  const SeqId b = m.create_sequence();
  ASSERT_TRUE(m.reserve(a, 8));  // 0 1
  ASSERT_TRUE(m.reserve(b, 8));  // 2 3
  m.append(a, 8);
  m.append(b, 8);
  EXPECT_TRUE(m.publish_block(a, 0, p.hashes[0], p.block(0)));
  EXPECT_FALSE(m.publish_block(b, 0, p.hashes[0], p.block(0)));
  EXPECT_TRUE(m.publish_block(b, 1, p.hashes[1], p.block(1)));
  EXPECT_FALSE(m.publish_block(a, 1, p.hashes[1], p.block(1)));
  EXPECT_FALSE(m.publish_block(a, 0, p.hashes[0], p.block(0)));  // already published
  EXPECT_FALSE(m.is_published(BlockId(1)));
  EXPECT_FALSE(m.is_published(BlockId(2)));
  EXPECT_EQ(m.prefix_stats().blocks_published, 2);
  EXPECT_EQ(match(m, p), (std::vector<int>{0, 3}));
  m.free_sequence(a);
  m.free_sequence(b);
  EXPECT_EQ(free_ids(m), (std::vector<int>{4, 5, 6, 7, 1, 0, 3, 2}));
  EXPECT_EQ(m.num_cached_free_blocks(), 2);
  m.check_invariants();
}

TEST(KvCacheManagerPrefix, OtherSaltsOtherTokensAndMissesDoNotMatch) {
  KvCacheManager m(8, 4);
  const Prompt p = make_prompt(10, 12, 4, "tenant-a");
  const SeqId a = computed(m, p);  // 0 1 2
  EXPECT_EQ(match(m, p), (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(match(m, make_prompt(10, 12, 4, "tenant-b")).empty());
  // Forged: the right hashes with other tokens in block 1 match block 0 only.
  Prompt forged = p;
  forged.tokens[5] = 999;
  EXPECT_EQ(match(m, forged), (std::vector<int>{0}));
  // Fewer hashes than full blocks is a shorter lookup.
  EXPECT_EQ(values(m.match_prefix(std::span<const BlockHash>(p.hashes).first(1), p.tokens)),
            (std::vector<int>{0}));
  // A miss ends the run even when later blocks are published.
  const SeqId b = m.fork_sequence(a);
  ASSERT_TRUE(m.make_block_exclusive(a, 0).ok());  // shared: a copies, 0 stays published
  ASSERT_TRUE(m.make_block_exclusive(b, 0).ok());  // now exclusive: unpublished
  EXPECT_TRUE(m.is_published(BlockId(1)));
  EXPECT_TRUE(match(m, p).empty());
  m.check_invariants();
}

TEST(KvCacheManagerPrefix, DropAndTruncateKeepFreedBlocksFindable) {
  KvCacheManager m(8, 4);
  const Prompt p = make_prompt(0, 12, 4);
  const SeqId a = computed(m, p);  // 0 1 2
  EXPECT_EQ(values(m.drop_blocks(a, 1, 1)), (std::vector<int>{1}));
  EXPECT_TRUE(m.is_published(BlockId(1)));  // cached-free: its bytes are intact
  EXPECT_EQ(m.num_cached_free_blocks(), 1);
  EXPECT_EQ(match(m, p), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(table_ids(m, a), (std::vector<int>{0, 2}));
  m.check_invariants();
  // A cut inside block 2: a appends into it next, so it leaves the index.
  EXPECT_TRUE(m.truncate(a, 6).empty());
  EXPECT_FALSE(m.is_published(BlockId(2)));
  EXPECT_EQ(m.prefix_stats().blocks_unpublished, 1);
  EXPECT_EQ(match(m, p), (std::vector<int>{0, 1}));
  EXPECT_EQ(values(m.truncate(a, 4)), (std::vector<int>{2}));  // on a block boundary: 0 stays published
  EXPECT_TRUE(m.is_published(BlockId(0)));
  EXPECT_EQ(values(m.truncate(a, 0)), (std::vector<int>{0}));
  EXPECT_EQ(m.num_cached_free_blocks(), 2);
  EXPECT_EQ(m.prefix_stats().blocks_unpublished, 1);
  m.check_invariants();
  // Cutting into a shared published block unpublishes it too; the other holder keeps it.
  const SeqId c = attached(m, p);  // 0 1
  const SeqId d = m.fork_sequence(c);
  EXPECT_TRUE(m.truncate(d, 6).empty());
  EXPECT_FALSE(m.is_published(BlockId(1)));
  EXPECT_EQ(m.block_ref_count(c, 1), 2);
  EXPECT_EQ(match(m, p), (std::vector<int>{0}));
  m.check_invariants();
}

TEST(KvCacheManagerPrefixDeathTest, MisuseAborts) {
  KvCacheManager m(8, 4);
  const Prompt p = make_prompt(0, 8, 4);
  const SeqId a = computed(m, p);
  const std::vector<BlockId> hit = {BlockId(0)};
  EXPECT_DEATH(m.attach_prefix(a, hit), "attach_prefix needs an empty sequence, it has 8 tokens in 2 blocks");
  const SeqId b = m.create_sequence();
  const std::vector<BlockId> unpublished = {BlockId(5)};
  EXPECT_DEATH(m.attach_prefix(b, unpublished), "attach_prefix of block 5, which is not published");
  ASSERT_TRUE(m.reserve(b, 6));
  m.append(b, 6);
  EXPECT_DEATH(m.publish_block(b, 1, p.hashes[1], p.block(1)), "publish_block 1 is not one of its 1 full blocks");
  EXPECT_DEATH(m.publish_block(b, 0, p.hashes[0], p.block(0).first(3)), "with 3 tokens, a block holds 4");
  EXPECT_DEATH(m.match_prefix(p.hashes, std::span<const TokenId>(p.tokens).first(7)),
               "match_prefix: 2 hashes for 7 tokens");
}

}  // namespace
}  // namespace kvlm
