// Random prefix-caching workloads against a plain model of ref counts and the published index.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cache/cache_test_util.h"
#include "cache/kv_cache_manager.h"

namespace kvlm {
namespace {

using testing::free_ids;
using testing::table_ids;
using testing::values;

// What the manager should hold, kept the obvious way: each sequence's ids and tokens,
// and the published blocks with their hash and tokens (linear searches, tiny pools).
struct Model {
  struct Seq {
    std::vector<int> ids;
    std::vector<TokenId> tokens;  // one per cached token: the block contents
    int family = 0;               // which prompt its appended tokens continue
    int salt = 0;
  };
  struct Published {
    BlockHash hash;
    std::vector<TokenId> tokens;
  };
  std::map<int, Seq> seqs;               // by SeqId value
  std::map<int, Published> published;    // by block id
  PrefixCacheStats stats;

  std::vector<int> refs(int num_blocks) const {
    std::vector<int> r(static_cast<size_t>(num_blocks), 0);
    for (const auto& [id, s] : seqs) {
      for (int b : s.ids) ++r[static_cast<size_t>(b)];
    }
    return r;
  }
  std::optional<int> find(const BlockHash& hash, std::span<const TokenId> tokens) const {
    for (const auto& [block, p] : published) {
      if (p.hash == hash) {
        if (std::equal(p.tokens.begin(), p.tokens.end(), tokens.begin(), tokens.end())) return block;
        return std::nullopt;
      }
    }
    return std::nullopt;
  }
  bool insert(int block, const BlockHash& hash, std::span<const TokenId> tokens) {
    if (published.contains(block)) return false;
    for (const auto& [b, p] : published) {
      if (p.hash == hash) return false;
    }
    published[block] = Published{hash, {tokens.begin(), tokens.end()}};
    return true;
  }
  // A block handed out for new content loses its place in the index.
  void allocated(int block) {
    if (published.erase(block) > 0) ++stats.blocks_evicted;
  }
  void written_in_place(int block) {
    if (published.erase(block) > 0) ++stats.blocks_unpublished;
  }
};

void run_random_prefix_ops(uint32_t seed, int num_blocks, int block_size) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " blocks " << num_blocks << " block_size " << block_size);
  std::mt19937 rng(seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int b = block_size;
  const int max_tokens = 8 * b;
  // Prompt families that share prefixes of different lengths: 1 shares two blocks with 0,
  // 2 shares nothing, 3 differs inside the first block. Tokens from a small vocabulary.
  std::vector<std::vector<TokenId>> families(4, std::vector<TokenId>(static_cast<size_t>(max_tokens)));
  for (auto& t : families[0]) t = uniform(0, 40);
  for (auto& t : families[2]) t = uniform(0, 40);
  families[1] = families[0];
  families[3] = families[0];
  for (int i = 2 * b; i < max_tokens; ++i) families[1][static_cast<size_t>(i)] = 100 + uniform(0, 40);
  families[3][static_cast<size_t>(b / 2)] = 1000;
  const std::vector<BlockHash> roots = {prefix_root_hash("random-model", ""), prefix_root_hash("random-model", "s")};

  KvCacheManager m(num_blocks, block_size);
  Model model;
  std::map<std::string, int> counts;
  auto pick = [&] {
    auto it = model.seqs.begin();
    std::advance(it, uniform(0, static_cast<int>(model.seqs.size()) - 1));
    return it;
  };
  auto new_seq = [&](int family, int salt) {
    const SeqId s = m.create_sequence();
    model.seqs[s.value] = Model::Seq{{}, {}, family, salt};
    return s;
  };

  for (int step = 0; step < 3000; ++step) {
    const int op = model.seqs.empty() ? 0 : uniform(0, 12);
    if (op == 0) {
      if (model.seqs.size() < 10) new_seq(uniform(0, 3), uniform(0, 1));
      ++counts["create"];
    } else if (op <= 3) {  // reserve + append the next tokens of the sequence's family
      auto it = pick();
      Model::Seq& s = it->second;
      const int len = static_cast<int>(s.tokens.size());
      const int n = uniform(0, std::min(3 * b, max_tokens - len));
      const std::vector<int> free_before = free_ids(m);
      const int missing = std::max(0, m.blocks_for_tokens(len + n) - static_cast<int>(s.ids.size()));
      const bool ok = m.reserve(SeqId(it->first), n);
      ASSERT_EQ(ok, missing <= static_cast<int>(free_before.size()));
      if (ok) {
        for (int i = 0; i < missing; ++i) {
          s.ids.push_back(free_before[static_cast<size_t>(i)]);
          model.allocated(free_before[static_cast<size_t>(i)]);
        }
        const int appended = uniform(0, n);
        m.append(SeqId(it->first), appended);
        const auto& fam = families[static_cast<size_t>(s.family)];
        s.tokens.insert(s.tokens.end(), fam.begin() + len, fam.begin() + len + appended);
        ++counts["reserve"];
      }
    } else if (op <= 5) {  // publish one full block
      auto it = pick();
      Model::Seq& s = it->second;
      const int full = static_cast<int>(s.tokens.size()) / b;
      if (full > 0) {
        const int idx = uniform(0, full - 1);
        const std::vector<BlockHash> hashes = chain_block_hashes(roots[static_cast<size_t>(s.salt)], s.tokens, b);
        const std::span<const TokenId> block_tokens =
            std::span<const TokenId>(s.tokens).subspan(static_cast<size_t>(idx * b), static_cast<size_t>(b));
        const BlockHash& hash = hashes[static_cast<size_t>(idx)];
        const bool want = model.insert(s.ids[static_cast<size_t>(idx)], hash, block_tokens);
        ASSERT_EQ(m.publish_block(SeqId(it->first), idx, hash, block_tokens), want);
        if (want) ++model.stats.blocks_published;
        ++counts[want ? "published" : "publish_refused"];
      }
    } else if (op <= 7) {  // a new request: match its prompt and attach the hits
      if (model.seqs.size() < 10) {
        const int family = uniform(0, 3);
        const int salt = uniform(0, 1);
        const auto& fam = families[static_cast<size_t>(family)];
        const std::span<const TokenId> prompt = std::span<const TokenId>(fam).first(
            static_cast<size_t>(uniform(0, max_tokens)));
        const std::vector<BlockHash> hashes = chain_block_hashes(roots[static_cast<size_t>(salt)], prompt, b);
        std::vector<int> want;
        for (size_t i = 0; i < hashes.size(); ++i) {
          const std::optional<int> hit = model.find(hashes[i], prompt.subspan(i * static_cast<size_t>(b),
                                                                              static_cast<size_t>(b)));
          if (!hit) break;
          want.push_back(*hit);
        }
        const std::vector<BlockId> got = m.match_prefix(hashes, prompt);
        ASSERT_EQ(values(got), want);
        const std::vector<int> r = model.refs(num_blocks);
        for (int id : want) counts["revived"] += r[static_cast<size_t>(id)] == 0 ? 1 : 0;
        const SeqId s = new_seq(family, salt);
        m.attach_prefix(s, got);
        Model::Seq& ms = model.seqs[s.value];
        ms.ids = want;
        ms.tokens.assign(fam.begin(), fam.begin() + static_cast<std::ptrdiff_t>(want.size()) * b);
        model.stats.prefix_hit_blocks += static_cast<int64_t>(want.size());
        ++counts[want.empty() ? "miss" : "hit"];
      }
    } else if (op == 8) {
      if (model.seqs.size() < 10) {
        auto it = pick();
        const Model::Seq copy = it->second;
        model.seqs[m.fork_sequence(SeqId(it->first)).value] = copy;
        ++counts["fork"];
      }
    } else if (op == 9) {
      auto it = pick();
      Model::Seq& s = it->second;
      if (!s.ids.empty()) {
        const int idx = uniform(0, static_cast<int>(s.ids.size()) - 1);
        const int id = s.ids[static_cast<size_t>(idx)];
        const int rc = model.refs(num_blocks)[static_cast<size_t>(id)];
        const std::vector<int> free_before = free_ids(m);
        const Result<std::optional<BlockSwap>> swap = m.make_block_exclusive(SeqId(it->first), idx);
        if (rc == 1) {
          ASSERT_TRUE(swap.ok());
          ASSERT_FALSE(swap->has_value());
          model.written_in_place(id);
          ++counts["exclusive_in_place"];
        } else if (free_before.empty()) {
          ASSERT_FALSE(swap.ok());
          ++counts["exclusive_failed"];
        } else {
          ASSERT_TRUE(swap.ok());
          ASSERT_TRUE(swap->has_value());
          ASSERT_EQ((*swap)->shared.value, id);
          ASSERT_EQ((*swap)->copy.value, free_before.front());
          model.allocated(free_before.front());
          s.ids[static_cast<size_t>(idx)] = free_before.front();
          ++counts["exclusive_copied"];
        }
      }
    } else if (op == 10) {
      auto it = pick();
      Model::Seq& s = it->second;
      const int full = static_cast<int>(s.tokens.size()) / b;
      if (full > 0) {
        const int first = uniform(0, full - 1);
        const int count = uniform(0, full - first);
        std::vector<int> released(s.ids.begin() + first, s.ids.begin() + first + count);
        std::reverse(released.begin(), released.end());
        std::vector<int> r = model.refs(num_blocks), want;
        for (int id : released) {
          if (--r[static_cast<size_t>(id)] == 0) want.push_back(id);
        }
        ASSERT_EQ(values(m.drop_blocks(SeqId(it->first), first, count)), want);
        s.ids.erase(s.ids.begin() + first, s.ids.begin() + first + count);
        s.tokens.erase(s.tokens.begin() + first * b, s.tokens.begin() + (first + count) * b);
        ++counts["drop"];
      }
    } else if (op == 11) {
      auto it = pick();
      Model::Seq& s = it->second;
      const int n = uniform(0, static_cast<int>(s.tokens.size()));
      const size_t keep = static_cast<size_t>(m.blocks_for_tokens(n));
      std::vector<int> released(s.ids.begin() + static_cast<std::ptrdiff_t>(keep), s.ids.end());
      std::reverse(released.begin(), released.end());
      std::vector<int> r = model.refs(num_blocks), want;
      for (int id : released) {
        if (--r[static_cast<size_t>(id)] == 0) want.push_back(id);
      }
      ASSERT_EQ(values(m.truncate(SeqId(it->first), n)), want);
      s.ids.resize(keep);
      s.tokens.resize(static_cast<size_t>(n));
      if (n % b != 0) model.written_in_place(s.ids[static_cast<size_t>(n / b)]);
      ++counts["truncate"];
    } else {
      auto it = pick();
      m.free_sequence(SeqId(it->first));
      model.seqs.erase(it);
      ++counts["free"];
    }

    // The books, against the model.
    m.check_invariants();
    const std::vector<int> r = model.refs(num_blocks);
    for (const auto& [id, s] : model.seqs) {
      ASSERT_EQ(table_ids(m, SeqId(id)), s.ids) << "step " << step;
      ASSERT_EQ(m.table(SeqId(id)).num_tokens(), static_cast<int>(s.tokens.size()));
    }
    int cached_free = 0;
    for (int id = 0; id < num_blocks; ++id) {
      ASSERT_EQ(m.pool().ref_count(BlockId(id)), r[static_cast<size_t>(id)]) << "block " << id;
      const bool published = model.published.contains(id);
      ASSERT_EQ(m.is_published(BlockId(id)), published) << "block " << id << " step " << step;
      cached_free += published && r[static_cast<size_t>(id)] == 0 ? 1 : 0;
    }
    ASSERT_EQ(m.num_published_blocks(), static_cast<int>(model.published.size()));
    ASSERT_EQ(m.num_cached_free_blocks(), cached_free);
    ASSERT_EQ(m.prefix_stats().blocks_published, model.stats.blocks_published);
    ASSERT_EQ(m.prefix_stats().prefix_hit_blocks, model.stats.prefix_hit_blocks);
    ASSERT_EQ(m.prefix_stats().blocks_evicted, model.stats.blocks_evicted);
    ASSERT_EQ(m.prefix_stats().blocks_unpublished, model.stats.blocks_unpublished);
  }
  // Every path ran: hits on live and cached-free blocks, evictions, refusals, unpublishing.
  for (const char* kind : {"create", "reserve", "published", "publish_refused", "hit", "miss", "revived", "fork",
                           "exclusive_in_place", "exclusive_copied", "drop", "truncate", "free"}) {
    EXPECT_GT(counts[kind], 0) << kind;
  }
  EXPECT_GT(model.stats.blocks_evicted, 0);
  EXPECT_GT(model.stats.blocks_unpublished, 0);

  for (const auto& [id, s] : model.seqs) m.free_sequence(SeqId(id));
  m.check_invariants();
  EXPECT_EQ(m.num_sequences(), 0);
  EXPECT_EQ(m.num_free_blocks(), num_blocks);
  for (int id = 0; id < num_blocks; ++id) EXPECT_EQ(m.pool().ref_count(BlockId(id)), 0) << "block " << id;
  // Whatever is still published is now cached-free, and findable.
  EXPECT_EQ(m.num_cached_free_blocks(), m.num_published_blocks());
  EXPECT_EQ(m.num_published_blocks(), static_cast<int>(model.published.size()));
}

TEST(KvCacheManagerPrefix, RandomOpsMatchTheModelAndLeakNothing) {
  for (uint32_t seed : {21u, 22u}) {
    run_random_prefix_ops(seed, 16, 1);
    run_random_prefix_ops(seed, 24, 4);
    run_random_prefix_ops(seed, 40, 16);
  }
}

}  // namespace
}  // namespace kvlm
