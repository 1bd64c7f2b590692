// KvStorage copy_block, copy_token and compact: exact for per-token codecs, within the codec's bound where KIVI re-encodes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kv/kv_block_format.h"
#include "kv/kv_storage.h"

namespace kvlm {
namespace {

// Three layers, two kv heads (a GQA model's cache: the query heads never reach the storage),
// head_dim 16 so int4/KIVI values have groups of 16.
KvLayout layout_for(int block_size) {
  return KvLayout{.num_layers = 3, .num_kv_heads = 2, .head_dim = 16, .block_size = block_size};
}

// K and V of one token in every layer: [num_layers, 2 (K, V), num_kv_heads, head_dim].
using TokenValues = std::vector<float>;

TokenValues random_token(const KvLayout& l, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  TokenValues x(static_cast<size_t>(l.num_layers) * 2 * l.values_per_token());
  for (float& e : x) e = normal(rng);
  return x;
}

void write(KvStorage& s, BlockId block, int slot, const TokenValues& x) {
  const size_t w = s.layout().values_per_token();
  for (int layer = 0; layer < s.layout().num_layers; ++layer) {
    s.write_token(layer, block, slot, x.data() + (2 * layer) * w, x.data() + (2 * layer + 1) * w);
  }
}

TokenValues read(const KvStorage& s, BlockId block, int slot) {
  const size_t w = s.layout().values_per_token();
  TokenValues x(static_cast<size_t>(s.layout().num_layers) * 2 * w);
  for (int layer = 0; layer < s.layout().num_layers; ++layer) {
    s.read_token(layer, block, slot, x.data() + (2 * layer) * w, x.data() + (2 * layer + 1) * w);
  }
  return x;
}

bool bits_equal(const TokenValues& a, const TokenValues& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The largest error a KIVI role may add when it encodes `before` (what the tokens read
// before), for value e of token t: keys per channel over the block's tokens, values per
// group of the token's row; half a quantization step plus the f16 rounding of scale and min.
// before: [num_tokens, num_kv_heads, head_dim] of one layer and role, the tokens of one block.
std::vector<float> kivi_bounds(KvType type, KvRole role, const KvLayout& l, const std::vector<float>& before) {
  const int levels = (1 << kv_format::bits(type)) - 1;
  const size_t w = l.values_per_token();
  const size_t n = before.size() / w;
  const int g = kv_format::group_size(l.head_dim);
  std::vector<float> bound(before.size());
  for (size_t t = 0; t < n; ++t) {
    for (size_t e = 0; e < w; ++e) {
      float lo = INFINITY, hi = -INFINITY;
      if (role == KvRole::kKey) {
        for (size_t u = 0; u < n; ++u) {
          lo = std::min(lo, before[u * w + e]);
          hi = std::max(hi, before[u * w + e]);
        }
      } else {
        const size_t g0 = e / static_cast<size_t>(g) * static_cast<size_t>(g);
        for (size_t d = g0; d < g0 + static_cast<size_t>(g); ++d) {
          lo = std::min(lo, before[t * w + d]);
          hi = std::max(hi, before[t * w + d]);
        }
      }
      const float range = hi - lo;
      bound[t * w + e] = 0.5f * range / static_cast<float>(levels) + (std::fabs(lo) + range) * 0x1p-10f + 1e-6f;
    }
  }
  return bound;
}

// One layer's K or V part of a TokenValues.
std::vector<float> part(const KvLayout& l, const TokenValues& x, int layer, KvRole role) {
  const size_t w = l.values_per_token();
  const size_t at = (2 * static_cast<size_t>(layer) + (role == KvRole::kKey ? 0 : 1)) * w;
  return {x.begin() + static_cast<std::ptrdiff_t>(at), x.begin() + static_cast<std::ptrdiff_t>(at + w)};
}

// The (K, V) type pairs to run: each type for both, plus mixes of KIVI with per-token codecs.
std::vector<std::pair<KvType, KvType>> type_pairs() {
  std::vector<std::pair<KvType, KvType>> pairs;
  for (KvType t : all_kv_types()) pairs.emplace_back(t, t);
  pairs.emplace_back(KvType::kKivi4, KvType::kInt8);
  pairs.emplace_back(KvType::kF16, KvType::kKivi2);
  return pairs;
}

std::string name(std::pair<KvType, KvType> types, int block_size) {
  return fmt::format("K {} V {} block_size {}", kv_type_name(types.first), kv_type_name(types.second), block_size);
}

// copy_block: the destination reads back exactly what the source does, sealed or staged, and
// takes the source's staging state; a destination staging buffer no longer needed goes back.
TEST(KvStorageCopy, CopyBlockIsExactIncludingStaging) {
  for (int bs : {1, 4, 16}) {
    for (const auto& types : type_pairs()) {
      SCOPED_TRACE(name(types, bs));
      const KvLayout l = layout_for(bs);
      KvStorage s(l, types.first, types.second, 4);
      std::mt19937 rng(static_cast<uint32_t>(bs));
      // Block 0: full and sealed. Block 1: staged (KIVI), first slot only when bs > 1.
      for (int slot = 0; slot < bs; ++slot) write(s, BlockId(0), slot, random_token(l, rng));
      for (int layer = 0; layer < l.num_layers; ++layer) s.seal_block(layer, BlockId(0));
      write(s, BlockId(1), 0, random_token(l, rng));
      // Destinations: block 2 staged, block 3 sealed.
      for (int slot = 0; slot < bs; ++slot) write(s, BlockId(2), slot, random_token(l, rng));
      for (int slot = 0; slot < bs; ++slot) write(s, BlockId(3), slot, random_token(l, rng));
      for (int layer = 0; layer < l.num_layers; ++layer) s.seal_block(layer, BlockId(3));
      const bool kivi = is_kivi(types.first) || is_kivi(types.second);

      const size_t staging_before = s.staging_bytes();
      s.copy_block(BlockId(0), BlockId(2));
      s.copy_block(BlockId(1), BlockId(3));
      for (int slot = 0; slot < bs; ++slot) {
        ASSERT_TRUE(bits_equal(read(s, BlockId(2), slot), read(s, BlockId(0), slot))) << "slot " << slot;
        ASSERT_TRUE(bits_equal(read(s, BlockId(3), slot), read(s, BlockId(1), slot))) << "slot " << slot;
      }
      for (int layer = 0; layer < l.num_layers; ++layer) {
        EXPECT_FALSE(s.is_staged(layer, BlockId(2)));
        EXPECT_EQ(s.is_staged(layer, BlockId(3)), kivi);
      }
      // Staged now: blocks 1 and 3 in every layer and KIVI role; block 3 took the buffers that
      // block 2 gave back, so no buffer was allocated.
      int staged = 0;
      for (int layer = 0; layer < l.num_layers; ++layer) {
        for (const float* const* rows : {s.k_staged_table(layer), s.v_staged_table(layer)}) {
          for (int b = 0; rows != nullptr && b < 4; ++b) staged += rows[b] != nullptr ? 1 : 0;
        }
      }
      const int roles = (is_kivi(types.first) ? 1 : 0) + (is_kivi(types.second) ? 1 : 0);
      EXPECT_EQ(staged, 2 * roles * l.num_layers);
      EXPECT_EQ(s.staging_bytes(), staging_before);
      s.copy_block(BlockId(1), BlockId(1));  // onto itself: nothing changes
      ASSERT_TRUE(bits_equal(read(s, BlockId(3), 0), read(s, BlockId(1), 0)));
    }
  }
}

// copy_token between sealed and staged blocks in all four combinations: right after the copy
// the destination slot reads back exactly what the source did and its other slots are as they
// were. After sealing the destination, per-token codecs (and KIVI values copied sealed to
// sealed) are still exact; KIVI keys, and KIVI rows that went through staging, are within
// the codec's bound.
TEST(KvStorageCopy, CopyTokenIsExactUntilReencoded) {
  for (int bs : {1, 4, 16}) {
    for (const auto& types : type_pairs()) {
      for (const bool src_staged : {false, true}) {
        for (const bool dst_staged : {false, true}) {
          SCOPED_TRACE(name(types, bs) + fmt::format(" src {} dst {}", src_staged ? "staged" : "sealed",
                                                     dst_staged ? "staged" : "sealed"));
          const KvLayout l = layout_for(bs);
          KvStorage s(l, types.first, types.second, 2);
          std::mt19937 rng(static_cast<uint32_t>(bs * 7 + src_staged * 2 + dst_staged));
          const BlockId src(0), dst(1);
          for (BlockId b : {src, dst}) {
            for (int slot = 0; slot < bs; ++slot) write(s, b, slot, random_token(l, rng));
          }
          for (int layer = 0; layer < l.num_layers; ++layer) {
            if (!src_staged) s.seal_block(layer, src);
            if (!dst_staged) s.seal_block(layer, dst);
          }
          const int src_slot = bs - 1, dst_slot = bs / 2;
          const TokenValues token = read(s, src, src_slot);
          std::vector<TokenValues> before(static_cast<size_t>(bs));
          for (int slot = 0; slot < bs; ++slot) before[static_cast<size_t>(slot)] = read(s, dst, slot);
          before[static_cast<size_t>(dst_slot)] = token;

          s.copy_token(src, src_slot, dst, dst_slot);
          for (int slot = 0; slot < bs; ++slot) {
            ASSERT_TRUE(bits_equal(read(s, dst, slot), before[static_cast<size_t>(slot)])) << "slot " << slot;
          }
          ASSERT_TRUE(bits_equal(read(s, src, src_slot), token));  // the source is only read

          for (int layer = 0; layer < l.num_layers; ++layer) s.seal_block(layer, dst);
          for (int layer = 0; layer < l.num_layers; ++layer) {
            for (KvRole role : {KvRole::kKey, KvRole::kValue}) {
              const KvType type = role == KvRole::kKey ? types.first : types.second;
              // Exact: a per-token codec whose rows were copied as bytes and never staged.
              const bool exact = !is_kivi(type) || (role == KvRole::kValue && !src_staged && !dst_staged);
              std::vector<float> pre, post;
              for (int slot = 0; slot < bs; ++slot) {
                const std::vector<float> a = part(l, before[static_cast<size_t>(slot)], layer, role);
                const std::vector<float> b = part(l, read(s, dst, slot), layer, role);
                pre.insert(pre.end(), a.begin(), a.end());
                post.insert(post.end(), b.begin(), b.end());
              }
              if (exact) {
                ASSERT_EQ(std::memcmp(pre.data(), post.data(), pre.size() * sizeof(float)), 0)
                    << "layer " << layer << (role == KvRole::kKey ? " K" : " V");
                continue;
              }
              const std::vector<float> bound = kivi_bounds(type, role, l, pre);
              for (size_t e = 0; e < pre.size(); ++e) {
                ASSERT_LE(std::fabs(post[e] - pre[e]), bound[e]) << "layer " << layer << " value " << e;
              }
            }
          }
        }
      }
    }
  }
}

struct CompactCase {
  std::pair<KvType, KvType> types;
  int block_size;
  int residual_tokens;
};

// One sequence of a few blocks (written through write_tokens, as the model does) compacted to
// a random subset of its tokens: every kept token reads back at its new index as it did before,
// bit for bit for per-token codecs and in the new residual window, within the codec's bound
// where a KIVI block outside the window is encoded anew; the blocks are sealed as
// seal_full_blocks would leave them, and staging stays within one sequence's bound.
void run_compact_case(const CompactCase& c, uint32_t seed) {
  const KvLayout l = layout_for(c.block_size);
  const int bs = c.block_size;
  std::mt19937 rng(seed);
  const int num_tokens = std::uniform_int_distribution<int>(3 * bs, 6 * bs - 1)(rng);
  const int num_table_blocks = (num_tokens + bs - 1) / bs;
  SCOPED_TRACE(name(c.types, bs) + fmt::format(" residual {} tokens {} seed {}", c.residual_tokens, num_tokens, seed));
  const int num_pool_blocks = 8;
  KvStorage s(l, c.types.first, c.types.second, num_pool_blocks, {.kivi_residual_tokens = c.residual_tokens});
  std::vector<int32_t> table(num_pool_blocks);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  table.resize(static_cast<size_t>(num_table_blocks));

  const size_t w = l.values_per_token();
  for (int layer = 0; layer < l.num_layers; ++layer) {
    std::vector<float> k(static_cast<size_t>(num_tokens) * w), v(k.size());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& e : k) e = normal(rng);
    for (float& e : v) e = normal(rng);
    s.write_tokens(layer, table, 0, num_tokens, k.data(), v.data());
  }
  auto at = [&](int token) { return BlockId(table[static_cast<size_t>(token / bs)]); };
  std::vector<TokenValues> before(static_cast<size_t>(num_tokens));
  for (int t = 0; t < num_tokens; ++t) before[static_cast<size_t>(t)] = read(s, at(t), t % bs);

  // Keep a few sink tokens, a random middle and a recent window, as the eviction policies do.
  std::vector<int> kept;
  const int num_sinks = std::uniform_int_distribution<int>(0, 3)(rng);
  const int window = std::uniform_int_distribution<int>(0, 2 * bs)(rng);
  const double p = std::uniform_real_distribution<double>(0.1, 0.9)(rng);
  for (int t = 0; t < num_tokens; ++t) {
    if (t < num_sinks || t >= num_tokens - window || std::bernoulli_distribution(p)(rng)) kept.push_back(t);
  }
  s.compact(table, kept);

  const int n = static_cast<int>(kept.size());
  const int sealed_end = std::max(0, n / bs - s.residual_blocks());
  for (int layer = 0; layer < l.num_layers; ++layer) {
    for (int j = 0; j < (n + bs - 1) / bs; ++j) {
      if (j < sealed_end) {
        ASSERT_FALSE(s.is_staged(layer, BlockId(table[static_cast<size_t>(j)]))) << "block " << j;
      }
    }
  }
  for (int j = 0; j < (n + bs - 1) / bs; ++j) {
    for (int layer = 0; layer < l.num_layers; ++layer) {
      for (KvRole role : {KvRole::kKey, KvRole::kValue}) {
        const KvType type = role == KvRole::kKey ? c.types.first : c.types.second;
        const bool window_block = j >= sealed_end;
        std::vector<float> pre, post;
        int first_src_block = -1;
        bool moved_only_sealed_values = true;
        for (int i = j * bs; i < std::min(n, (j + 1) * bs); ++i) {
          const int t = kept[static_cast<size_t>(i)];
          const std::vector<float> a = part(l, before[static_cast<size_t>(t)], layer, role);
          const std::vector<float> b = part(l, read(s, at(i), i % bs), layer, role);
          pre.insert(pre.end(), a.begin(), a.end());
          post.insert(post.end(), b.begin(), b.end());
          if (first_src_block < 0) first_src_block = t / bs;
          // A value row moved out of a staged block is encoded for the first time here.
          const int old_sealed_end = std::max(0, num_tokens / bs - s.residual_blocks());
          if (t / bs >= old_sealed_end) moved_only_sealed_values = false;
        }
        const bool untouched = kept[static_cast<size_t>(std::min(n, (j + 1) * bs) - 1)] == std::min(n, (j + 1) * bs) - 1;
        const bool exact = !is_kivi(type) || window_block || untouched ||
                           (role == KvRole::kValue && moved_only_sealed_values);
        if (exact) {
          ASSERT_EQ(std::memcmp(pre.data(), post.data(), pre.size() * sizeof(float)), 0)
              << "block " << j << " layer " << layer << (role == KvRole::kKey ? " K" : " V");
          continue;
        }
        const std::vector<float> bound = kivi_bounds(type, role, l, pre);
        for (size_t e = 0; e < pre.size(); ++e) {
          ASSERT_LE(std::fabs(post[e] - pre[e]), bound[e])
              << "block " << j << " layer " << layer << (role == KvRole::kKey ? " K" : " V") << " value " << e;
        }
      }
    }
  }
  EXPECT_LE(s.staging_bytes(), s.residual_bytes_per_sequence());
  // The caller truncates and releases the blocks after the new end; the rest of the sequence's
  // staging is the new window's.
  const size_t new_blocks = static_cast<size_t>((n + bs - 1) / bs);
  s.release_blocks(std::span<const int32_t>(table).subspan(new_blocks));
  for (int layer = 0; layer < l.num_layers; ++layer) {
    int staged = 0;
    for (size_t j = 0; j < table.size(); ++j) {
      const bool is = s.is_staged(layer, BlockId(table[j]));
      if (j >= new_blocks) {
        EXPECT_FALSE(is) << "released block " << j;
      }
      staged += is ? 1 : 0;
    }
    EXPECT_LE(staged, s.residual_blocks() + 1) << "layer " << layer;
  }
}

// The eviction flow on a forked sequence: A and B share every block; A gives each block it
// will write a private copy (copy_block, as after make_block_exclusive), compacts, and B still
// reads what it did: exactly, except that a staged block after A's new end may have been
// sealed to make room, and then reads its encoding (within the codec's bound).
TEST(KvStorageCompact, LeavesASharingSequenceIntact) {
  for (const auto& types : type_pairs()) {
    SCOPED_TRACE(name(types, 4));
    const KvLayout l = layout_for(4);
    const int bs = 4, num_tokens = 16;
    KvStorage s(l, types.first, types.second, 8, {.kivi_residual_tokens = 4});
    const std::vector<int32_t> shared = {3, 0, 6, 1};
    std::mt19937 rng(5);
    const size_t w = l.values_per_token();
    for (int layer = 0; layer < l.num_layers; ++layer) {
      std::vector<float> k(num_tokens * w), v(k.size());
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (float& e : k) e = normal(rng);
      for (float& e : v) e = normal(rng);
      s.write_tokens(layer, shared, 0, num_tokens, k.data(), v.data());
    }
    std::vector<TokenValues> b_before;
    for (int t = 0; t < num_tokens; ++t) b_before.push_back(read(s, BlockId(shared[t / bs]), t % bs));

    // A keeps 2 sinks and the last 5 tokens: 7 tokens, blocks 0 and 1 are written. B's
    // staged block 3 (the residual window) gives its buffer to A's window.
    const std::vector<int> kept = {0, 1, 11, 12, 13, 14, 15};
    std::vector<int32_t> a_table = shared;
    for (int j : {0, 1}) {
      const int32_t copy = j == 0 ? 2 : 4;
      s.copy_block(BlockId(a_table[j]), BlockId(copy));
      a_table[j] = copy;
    }
    s.compact(a_table, kept);
    for (int i = 0; i < static_cast<int>(kept.size()); ++i) {
      const TokenValues after = read(s, BlockId(a_table[i / bs]), i % bs);
      const TokenValues& want = b_before[static_cast<size_t>(kept[static_cast<size_t>(i)])];
      // A's new length leaves both of its blocks in the window (7 tokens, residual 1 block + tail).
      ASSERT_TRUE(bits_equal(after, want)) << "A token " << i;
    }
    for (int t = 0; t < num_tokens; ++t) {
      const TokenValues after = read(s, BlockId(shared[t / bs]), t % bs);
      for (int layer = 0; layer < l.num_layers; ++layer) {
        for (KvRole role : {KvRole::kKey, KvRole::kValue}) {
          const KvType type = role == KvRole::kKey ? types.first : types.second;
          const std::vector<float> a = part(l, b_before[static_cast<size_t>(t)], layer, role);
          const std::vector<float> b = part(l, after, layer, role);
          if (!is_kivi(type) || t < 12) {  // blocks that B had sealed or never staged: untouched
            ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "B token " << t;
            continue;
          }
          std::vector<float> block_before;  // B's tokens of t's block, for the per-channel bound
          for (int u = t / bs * bs; u < std::min(num_tokens, t / bs * bs + bs); ++u) {
            const std::vector<float> x = part(l, b_before[static_cast<size_t>(u)], layer, role);
            block_before.insert(block_before.end(), x.begin(), x.end());
          }
          const std::vector<float> bound = kivi_bounds(type, role, l, block_before);
          const size_t row = static_cast<size_t>(t % bs) * w;
          for (size_t e = 0; e < w; ++e) ASSERT_LE(std::fabs(b[e] - a[e]), bound[row + e]) << "B token " << t;
        }
      }
    }
  }
}

// Keeping every token, a prefix, or nothing moves nothing: every kept token reads back bit for
// bit (KIVI: the blocks were sealed or staged as the window wants them already).
TEST(KvStorageCompact, NothingMovesWhenTheKeptTokensArePrefixes) {
  for (const auto& types : type_pairs()) {
    SCOPED_TRACE(name(types, 4));
    const KvLayout l = layout_for(4);
    KvStorage s(l, types.first, types.second, 4, {.kivi_residual_tokens = 4});
    const std::vector<int32_t> table = {2, 0, 3};
    std::mt19937 rng(9);
    std::vector<TokenValues> before;
    for (int t = 0; t < 11; ++t) {
      before.push_back(random_token(l, rng));
      write(s, BlockId(table[t / 4]), t % 4, before.back());
      for (int layer = 0; layer < l.num_layers; ++layer) s.seal_full_blocks(layer, table.data(), t + 1);
    }
    for (int t = 0; t < 11; ++t) before[static_cast<size_t>(t)] = read(s, BlockId(table[t / 4]), t % 4);
    const size_t staging = s.staging_bytes();
    for (int n : {11, 6, 0}) {
      std::vector<int> kept(static_cast<size_t>(n));
      std::iota(kept.begin(), kept.end(), 0);
      s.compact(table, kept);
      for (int t = 0; t < n; ++t) {
        ASSERT_TRUE(bits_equal(read(s, BlockId(table[t / 4]), t % 4), before[static_cast<size_t>(t)])) << n;
      }
      EXPECT_EQ(s.staging_bytes(), staging);
    }
  }
}

TEST(KvStorageCompactDeathTest, RefusesBadKeepLists) {
  const KvLayout l = layout_for(4);
  KvStorage s(l, KvType::kF16, KvType::kF16, 4);
  const std::vector<int32_t> table = {1, 2};
  EXPECT_DEATH(s.compact(table, std::vector<int>{0, 3, 3}), "strictly increasing");
  EXPECT_DEATH(s.compact(table, std::vector<int>{1, 8}), "outside the table's 8 slots");
  EXPECT_DEATH(s.compact(table, std::vector<int>{-1}), "outside");
  EXPECT_DEATH(s.copy_token(BlockId(0), 4, BlockId(1), 0), "out of range");
  EXPECT_DEATH(s.copy_block(BlockId(0), BlockId(4)), "block 4 out of range");
}

TEST(KvStorageCompact, KeptTokensReadBackAsBefore) {
  for (int bs : {1, 4, 16}) {
    for (const auto& types : type_pairs()) {
      const bool kivi = is_kivi(types.first) || is_kivi(types.second);
      for (int residual : kivi ? std::vector<int>{0, bs + 1} : std::vector<int>{0}) {
        for (uint32_t seed = 0; seed < 4; ++seed) {
          run_compact_case({types, bs, residual}, seed * 131 + static_cast<uint32_t>(bs));
          if (testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvlm
