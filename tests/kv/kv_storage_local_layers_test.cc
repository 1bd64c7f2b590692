// KvStorage with sliding-window (local) layers: their arenas hold only local_num_blocks slots,
// which blocks take while pinned and keep, retained, until another block needs one; bytes,
// pins and reclaim order, refusals, KIVI staging per slot, copy_block and compaction.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kv/kv_block_format.h"
#include "kv/kv_storage.h"

namespace kvlm {
namespace {

// 3 layers: 0 and 2 local, 1 global; 4 tokens per block; a token is 16 values per role.
const KvLayout kLayout{.num_layers = 3, .num_kv_heads = 2, .head_dim = 8, .block_size = 4};
constexpr int kBs = 4;
constexpr size_t kWidth = 16;
constexpr int kLocalLayers[] = {0, 2};

KvStorageOptions local_options(int local_slots, int residual_tokens = 0) {
  KvStorageOptions o;
  o.kivi_residual_tokens = residual_tokens;
  o.local_layers = {1, 0, 1};
  o.local_num_blocks = local_slots;
  return o;
}

// Token t's K (role 0) or V (role 1) in `layer`: N(0, 1), different for every token, layer and role.
std::vector<float> values(int token, int layer, int role) {
  std::mt19937 rng(static_cast<uint32_t>((token * 8 + layer) * 2 + role + 1));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(kWidth);
  for (float& e : x) e = normal(rng);
  return x;
}

// Writes the sequence's tokens [first, first + count) to `layers` through write_tokens, as the
// model does (so KIVI blocks are sealed as the residual window passes them).
void write_sequence(KvStorage& s, std::span<const int32_t> table, int first, int count,
                    std::vector<int> layers = {0, 1, 2}) {
  for (int layer : layers) {
    std::vector<float> k, v;
    for (int t = first; t < first + count; ++t) {
      const std::vector<float> kt = values(t, layer, 0), vt = values(t, layer, 1);
      k.insert(k.end(), kt.begin(), kt.end());
      v.insert(v.end(), vt.begin(), vt.end());
    }
    s.write_tokens(layer, table, first, count, k.data(), v.data());
  }
}

// Writes tokens base .. base + count - 1 (their values) into slots [0, count) of one block, in every layer.
void write_block(KvStorage& s, int32_t block, int base, int count) {
  for (int slot = 0; slot < count; ++slot) {
    for (int l = 0; l < 3; ++l) {
      s.write_token(l, BlockId(block), slot, values(base + slot, l, 0).data(), values(base + slot, l, 1).data());
    }
  }
}

struct TokenKv {
  std::vector<float> k, v;
  const std::vector<float>& role(int r) const { return r == 0 ? k : v; }
};

TokenKv read(const KvStorage& s, int layer, BlockId block, int slot) {
  TokenKv x{std::vector<float>(kWidth), std::vector<float>(kWidth)};
  s.read_token(layer, block, slot, x.k.data(), x.v.data());
  return x;
}

TokenKv read_at(const KvStorage& s, int layer, std::span<const int32_t> table, int token) {
  return read(s, layer, BlockId(table[static_cast<size_t>(token / kBs)]), token % kBs);
}

int32_t local_slot(const KvStorage& s, int32_t block) {
  int32_t slot = -2;
  const int32_t table[] = {block};
  s.local_block_table(table, 0, 1, &slot);
  return slot;
}

// The largest error a KIVI role may add when it encodes `before`, for value e of token t (as
// in kv_storage_copy_test.cc): keys per channel over the block's tokens, values per group of
// the token's row; half a quantization step plus the f16 rounding of scale and min.
//   before: [num_tokens, num_kv_heads, head_dim], the tokens of one block of one layer and role
std::vector<float> kivi_bounds(KvType type, KvRole role, const std::vector<float>& before) {
  const int levels = (1 << kv_format::bits(type)) - 1;
  const size_t w = kWidth;
  const size_t n = before.size() / w;
  const size_t g = static_cast<size_t>(kv_format::group_size(kLayout.head_dim));
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
        for (size_t d = e / g * g; d < e / g * g + g; ++d) {
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

// Asserts that `after` reads `want` within the bound `type` allows for a block that held `block`
// ([block_size, kv_heads, head_dim] as read before it was encoded) at row `row`.
void expect_within(KvType type, KvRole role, const std::vector<float>& block, int row, const std::vector<float>& want,
                   const std::vector<float>& after, const std::string& what) {
  if (!is_kivi(type)) {
    for (size_t e = 0; e < kWidth; ++e) {
      ASSERT_NEAR(after[e], want[e], std::fabs(want[e]) * 0x1p-10f + 1e-6f) << what << " value " << e;  // f16
    }
    return;
  }
  const std::vector<float> bound = kivi_bounds(type, role, block);
  for (size_t e = 0; e < kWidth; ++e) {
    ASSERT_LE(std::fabs(after[e] - want[e]), bound[static_cast<size_t>(row) * kWidth + e]) << what << " value " << e;
  }
}

std::string types_name(KvType k, KvType v) {
  return std::string("K ") + std::string(kv_type_name(k)) + " V " + std::string(kv_type_name(v));
}

TEST(KvStorageLocalLayers, ArenasAndBytesFollowTheLayerGroups) {
  KvStorage s(kLayout, KvType::kF32, KvType::kF32, 20, local_options(5));
  ASSERT_TRUE(s.has_local_layers());
  EXPECT_EQ(s.num_local_layers(), 2);
  EXPECT_TRUE(s.is_local_layer(0));
  EXPECT_FALSE(s.is_local_layer(1));
  EXPECT_TRUE(s.is_local_layer(2));
  EXPECT_EQ(s.num_blocks(), 20);
  EXPECT_EQ(s.num_blocks(1), 20);
  EXPECT_EQ(s.num_blocks(0), 5);
  EXPECT_EQ(s.num_blocks(2), 5);
  // One layer-block: 4 tokens × 2 heads × 8 × 4 bytes, K and V: 512 bytes.
  EXPECT_EQ(s.bytes_per_block(), 512u);        // the one global layer
  EXPECT_EQ(s.local_bytes_per_block(), 1024u);  // the two local layers
  EXPECT_EQ(s.allocated_bytes(), 512u * 20 + 1024u * 5);
  EXPECT_EQ(s.bytes_per_token(), 3u * 128);  // every layer's bytes for a token (full-cache formula)
  EXPECT_EQ(s.used_bytes(3), 512u * 3);      // no local slot pinned yet
  ASSERT_TRUE(s.pin_local_block(BlockId(4)));
  ASSERT_TRUE(s.pin_local_block(BlockId(4)));  // a second pin of one block: still one slot
  ASSERT_TRUE(s.pin_local_block(BlockId(9)));
  EXPECT_EQ(s.used_bytes(3), 512u * 3 + 1024u * 2);
  s.unpin_local_block(BlockId(9));  // retained slots are reclaimable: not counted as used
  EXPECT_EQ(s.used_bytes(3), 512u * 3 + 1024u);
  EXPECT_EQ(s.local_slots_unpinned(), 4);
}

TEST(KvStorageLocalLayers, PinnedBlocksReadBackThroughTheirSlots) {
  KvStorage s(kLayout, KvType::kF32, KvType::kF32, 20, local_options(3));
  const std::vector<int32_t> table = {7, 2, 19, 11};  // 16 tokens
  for (int j = 0; j < 3; ++j) ASSERT_TRUE(s.pin_local_block(BlockId(table[static_cast<size_t>(j)])));
  EXPECT_EQ(s.local_blocks_in_use(), 3);
  write_sequence(s, table, 0, 12);
  std::vector<int32_t> local(4, -5);
  s.local_block_table(table, 0, 4, local.data());
  EXPECT_EQ(local, (std::vector<int32_t>{0, 1, 2, -1}));  // slots in pin order; 11 holds none
  EXPECT_FALSE(s.local_block_cached(BlockId(11)));
  EXPECT_TRUE(s.local_block_cached(BlockId(19)));
  EXPECT_EQ(s.local_pins(BlockId(19)), 1);
  EXPECT_EQ(s.local_pins(BlockId(11)), 0);
  for (int t = 0; t < 12; ++t) {
    for (int l = 0; l < 3; ++l) {
      const TokenKv x = read_at(s, l, table, t);
      EXPECT_EQ(x.k, values(t, l, 0)) << "token " << t << " layer " << l;
      EXPECT_EQ(x.v, values(t, l, 1)) << "token " << t << " layer " << l;
    }
  }
  EXPECT_EQ(s.peak_local_blocks_in_use(), 3);
  // The global layer needs no pin.
  s.write_token(1, BlockId(11), 0, values(12, 1, 0).data(), values(12, 1, 1).data());
  EXPECT_EQ(read(s, 1, BlockId(11), 0).k, values(12, 1, 0));
  // Unpinned, the blocks keep their slots and bytes; release_blocks does not touch local slots.
  for (int j = 0; j < 3; ++j) s.unpin_local_block(BlockId(table[static_cast<size_t>(j)]));
  s.release_blocks(table);
  EXPECT_EQ(s.local_blocks_in_use(), 0);
  EXPECT_EQ(s.local_blocks_retained(), 3);
  EXPECT_EQ(s.peak_local_blocks_in_use(), 3);
  for (int t = 0; t < 12; ++t) EXPECT_EQ(read_at(s, 0, table, t).k, values(t, 0, 0)) << t;
}

// Retained blocks are reclaimed oldest-unpinned first; a retained block pinned again keeps its
// slot and bytes (and joins the back of the line when unpinned); the global layer keeps all.
TEST(KvStorageLocalLayers, RetainedSlotsAreReclaimedOldestUnpinnedFirst) {
  KvStorage s(kLayout, KvType::kF32, KvType::kF32, 20, local_options(3));
  // Blocks 5, 6, 7, one sequence's 12 tokens.
  const std::vector<int32_t> table = {5, 6, 7};
  for (int32_t b : table) ASSERT_TRUE(s.pin_local_block(BlockId(b)));
  write_sequence(s, table, 0, 12);
  const int32_t slot5 = local_slot(s, 5), slot6 = local_slot(s, 6), slot7 = local_slot(s, 7);
  s.unpin_local_block(BlockId(6));
  s.unpin_local_block(BlockId(7));
  s.unpin_local_block(BlockId(5));  // retained, oldest first: 6, 7, 5
  EXPECT_EQ(s.local_blocks_in_use(), 0);
  EXPECT_EQ(s.local_blocks_retained(), 3);
  for (int t = 0; t < 12; ++t) {
    for (int l : kLocalLayers) EXPECT_EQ(read_at(s, l, table, t).v, values(t, l, 1)) << "token " << t;
  }

  // A hit on 7: same slot, same bytes; unpinned again it goes to the back: 6, 5, 7.
  ASSERT_TRUE(s.pin_local_block(BlockId(7)));
  EXPECT_EQ(local_slot(s, 7), slot7);
  EXPECT_EQ(s.local_blocks_retained(), 2);
  for (int t = 8; t < 12; ++t) EXPECT_EQ(read_at(s, 2, table, t).k, values(t, 2, 0)) << t;
  s.unpin_local_block(BlockId(7));

  ASSERT_TRUE(s.pin_local_block(BlockId(10)));
  EXPECT_FALSE(s.local_block_cached(BlockId(6)));
  EXPECT_EQ(local_slot(s, 10), slot6);
  EXPECT_TRUE(s.local_block_cached(BlockId(5)));
  EXPECT_TRUE(s.local_block_cached(BlockId(7)));
  for (int t = 0; t < 4; ++t) EXPECT_EQ(read_at(s, 0, table, t).k, values(t, 0, 0)) << t;  // 5 intact
  ASSERT_TRUE(s.pin_local_block(BlockId(11)));
  EXPECT_FALSE(s.local_block_cached(BlockId(5)));
  EXPECT_EQ(local_slot(s, 11), slot5);
  EXPECT_TRUE(s.local_block_cached(BlockId(7)));
  for (int t = 8; t < 12; ++t) EXPECT_EQ(read_at(s, 0, table, t).v, values(t, 0, 1)) << t;  // 7 intact
  ASSERT_TRUE(s.pin_local_block(BlockId(12)));
  EXPECT_FALSE(s.local_block_cached(BlockId(7)));
  EXPECT_EQ(local_slot(s, 12), slot7);
  EXPECT_EQ(s.local_blocks_retained(), 0);
  EXPECT_EQ(s.local_blocks_in_use(), 3);
  // The global layer never lets go.
  for (int t = 0; t < 12; ++t) EXPECT_EQ(read_at(s, 1, table, t).k, values(t, 1, 0)) << t;
  // A reclaimed block pinned again takes a slot anew: its old bytes are gone (the caller knows
  // from local_block_cached) and it is written afresh.
  s.unpin_local_block(BlockId(10));
  ASSERT_TRUE(s.pin_local_block(BlockId(6)));
  EXPECT_EQ(local_slot(s, 6), slot6);
  const std::vector<float> fresh(kWidth, 3.0f);
  s.write_token(0, BlockId(6), 0, fresh.data(), fresh.data());
  EXPECT_EQ(read(s, 0, BlockId(6), 0).k, fresh);
}

// A block pinned by two sequences keeps its slot until both let go.
TEST(KvStorageLocalLayers, ABlockStaysPinnedUntilItsLastPinGoes) {
  KvStorage s(kLayout, KvType::kF16, KvType::kF16, 8, local_options(1));
  ASSERT_TRUE(s.pin_local_block(BlockId(3)));
  ASSERT_TRUE(s.pin_local_block(BlockId(3)));
  EXPECT_EQ(s.local_pins(BlockId(3)), 2);
  s.unpin_local_block(BlockId(3));
  EXPECT_EQ(s.local_pins(BlockId(3)), 1);
  EXPECT_FALSE(s.pin_local_block(BlockId(4)));  // still pinned: not reclaimable
  s.unpin_local_block(BlockId(3));
  EXPECT_TRUE(s.pin_local_block(BlockId(4)));
  EXPECT_FALSE(s.local_block_cached(BlockId(3)));
}

// Every slot pinned: pin returns false and changes nothing.
TEST(KvStorageLocalLayers, PinFailsWhenEverySlotIsPinned) {
  KvStorage s(kLayout, KvType::kF32, KvType::kF32, 8, local_options(2));
  const std::vector<int32_t> table = {1, 0};
  for (int32_t b : table) ASSERT_TRUE(s.pin_local_block(BlockId(b)));
  write_sequence(s, table, 0, 8);
  EXPECT_FALSE(s.pin_local_block(BlockId(5)));
  EXPECT_FALSE(s.local_block_cached(BlockId(5)));
  EXPECT_EQ(s.local_pins(BlockId(5)), 0);
  EXPECT_EQ(s.local_blocks_in_use(), 2);
  EXPECT_EQ(s.local_blocks_retained(), 0);
  EXPECT_EQ(s.local_slots_unpinned(), 0);
  EXPECT_EQ(s.peak_local_blocks_in_use(), 2);
  EXPECT_EQ(s.local_pins(BlockId(1)), 1);
  EXPECT_EQ(s.local_pins(BlockId(0)), 1);
  for (int t = 0; t < 8; ++t) EXPECT_EQ(read_at(s, 2, table, t).k, values(t, 2, 0)) << t;
  // A block that holds a slot can take another pin.
  EXPECT_TRUE(s.pin_local_block(BlockId(1)));
  EXPECT_EQ(s.local_pins(BlockId(1)), 2);
}

TEST(KvStorageLocalLayersDeathTest, WritingALocalLayerWithoutAPinAborts) {
  KvStorage s(kLayout, KvType::kF16, KvType::kF16, 8, local_options(2));
  const std::vector<float> x(kWidth, 1.0f);
  EXPECT_DEATH(s.write_token(0, BlockId(3), 0, x.data(), x.data()),
               "block 3 is written in local layer 0 without a pin");
  ASSERT_TRUE(s.pin_local_block(BlockId(3)));
  s.write_token(0, BlockId(3), 0, x.data(), x.data());
  s.unpin_local_block(BlockId(3));  // retained: readable, not writable
  EXPECT_EQ(read(s, 0, BlockId(3), 0).k, x);
  EXPECT_DEATH(s.write_token(2, BlockId(3), 1, x.data(), x.data()),
               "block 3 is written in local layer 2 without a pin");
  const std::vector<int32_t> table = {3};
  EXPECT_DEATH(s.write_tokens(0, table, 0, 1, x.data(), x.data()), "without a pin");
  // KIVI stages before it encodes: the same check.
  KvStorage kivi(kLayout, KvType::kKivi4, KvType::kKivi2, 8, local_options(2));
  EXPECT_DEATH(kivi.write_token(0, BlockId(5), 0, x.data(), x.data()),
               "block 5 is written in local layer 0 without a pin");
}

TEST(KvStorageLocalLayersDeathTest, ReadingABlockWithNoSlotAborts) {
  KvStorage s(kLayout, KvType::kF16, KvType::kF16, 8, local_options(1));
  std::vector<float> k(kWidth), v(kWidth);
  EXPECT_DEATH(s.read_token(0, BlockId(3), 0, k.data(), v.data()), "block 3 holds no slot in local layer 0");
  // Reclaimed: block 4 takes 3's slot.
  ASSERT_TRUE(s.pin_local_block(BlockId(3)));
  s.write_token(0, BlockId(3), 0, k.data(), v.data());
  s.unpin_local_block(BlockId(3));
  ASSERT_TRUE(s.pin_local_block(BlockId(4)));
  EXPECT_DEATH(s.read_token(2, BlockId(3), 0, k.data(), v.data()), "block 3 holds no slot in local layer 2");
  EXPECT_DEATH(s.k_block(0, BlockId(3)), "holds no slot");
  s.read_token(1, BlockId(3), 0, k.data(), v.data());  // the global layer: any block
}

TEST(KvStorageLocalLayersDeathTest, UnpinningABlockThatIsNotPinnedAborts) {
  KvStorage s(kLayout, KvType::kF16, KvType::kF16, 8, local_options(2));
  EXPECT_DEATH(s.unpin_local_block(BlockId(2)), "local block 2 is not pinned");
  ASSERT_TRUE(s.pin_local_block(BlockId(2)));
  s.unpin_local_block(BlockId(2));
  EXPECT_DEATH(s.unpin_local_block(BlockId(2)), "local block 2 is not pinned");
  EXPECT_DEATH((void)s.pin_local_block(BlockId(8)), "block 8 out of range");
}

TEST(KvStorageLocalLayers, CreationErrorsAndWhatCombines) {
  // KIVI combines with local layers (staging per local slot).
  for (KvType k : {KvType::kKivi4, KvType::kKivi2, KvType::kF16}) {
    auto kivi = KvStorage::create(kLayout, k, KvType::kKivi2, 8, local_options(2, 4));
    ASSERT_TRUE(kivi.ok()) << kivi.status().message();
    EXPECT_TRUE((*kivi)->has_local_layers());
    EXPECT_NE((*kivi)->v_staged_table(0), nullptr);
  }
  auto no_slots = KvStorage::create(kLayout, KvType::kF16, KvType::kF16, 8, local_options(0));
  ASSERT_FALSE(no_slots.ok());
  EXPECT_NE(no_slots.status().message().find("local_num_blocks"), std::string::npos) << no_slots.status().message();
  KvStorageOptions wrong = local_options(2);
  wrong.local_layers = {1, 0};
  auto mismatch = KvStorage::create(kLayout, KvType::kF16, KvType::kF16, 8, wrong);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.status().message().find("2 local-layer flags for 3 layers"), std::string::npos);
  // All flags 0: a plain storage, where pins are no-ops.
  KvStorageOptions none = local_options(2);
  none.local_layers = {0, 0, 0};
  auto plain = KvStorage::create(kLayout, KvType::kF16, KvType::kF16, 8, none);
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE((*plain)->has_local_layers());
  EXPECT_TRUE((*plain)->pin_local_block(BlockId(1)));
  (*plain)->unpin_local_block(BlockId(1));
  (*plain)->unpin_local_block(BlockId(1));  // no pins kept, so no check either
  EXPECT_EQ((*plain)->local_pins(BlockId(1)), 0);
  EXPECT_FALSE((*plain)->local_block_cached(BlockId(1)));
  EXPECT_EQ((*plain)->allocated_bytes(), (*plain)->bytes_per_block() * 8);
}

TEST(KvStorageLocalLayers, BlocksPerSequenceCoverTheWindowAndTheStep) {
  // Window 24, one decode token: 24 tokens may straddle 7 blocks of 4 (ceil(24/4) + 1).
  EXPECT_EQ(KvStorage::local_blocks_per_sequence(24, 4, 1), 7);
  // A step of 8 tokens: its first query sees 23 earlier ones, 31 tokens: ceil(31/4) + 1 = 9.
  EXPECT_EQ(KvStorage::local_blocks_per_sequence(24, 4, 8), 9);
  EXPECT_EQ(KvStorage::local_blocks_per_sequence(512, 16, 1), 33);
}

// KIVI with local layers: write_tokens stages and seals a local layer's blocks as it does a
// global one's (staging indexed by local slot); a staged block that loses its last pin gives
// its staging buffers and slot back at once, a sealed one is retained.
TEST(KvStorageLocalLayers, KiviStagesPerSlotAndAStagedBlockUnpinnedFreesItsSlot) {
  for (const auto& [kt, vt] : {std::pair{KvType::kKivi4, KvType::kF16}, std::pair{KvType::kF16, KvType::kKivi2},
                               std::pair{KvType::kKivi2, KvType::kKivi4}}) {
    SCOPED_TRACE(types_name(kt, vt));
    KvStorage s(kLayout, kt, vt, 20, local_options(6, /*residual_tokens=*/4));
    ASSERT_EQ(s.residual_blocks(), 1);
    const std::vector<int32_t> table = {12, 3, 17, 8, 0};
    for (int32_t b : table) ASSERT_TRUE(s.pin_local_block(BlockId(b)));
    // 18 tokens in steps of 5, 6, 7: blocks 0..2 sealed, 3 (the residual window) and 4 (the tail) staged.
    write_sequence(s, table, 0, 5);
    write_sequence(s, table, 5, 6);
    write_sequence(s, table, 11, 7);
    for (int l = 0; l < 3; ++l) {
      for (int j = 0; j < 5; ++j) {
        EXPECT_EQ(s.is_staged(l, BlockId(table[static_cast<size_t>(j)])), j >= 3) << "layer " << l << " block " << j;
      }
    }
    for (int l : kLocalLayers) {
      for (const auto& [staged, is] :
           {std::pair{s.k_staged_table(l), is_kivi(kt)}, std::pair{s.v_staged_table(l), is_kivi(vt)}}) {
        ASSERT_EQ(staged != nullptr, is);
        if (staged == nullptr) continue;
        EXPECT_EQ(staged[local_slot(s, table[0])], nullptr);
        EXPECT_NE(staged[local_slot(s, table[3])], nullptr);
        EXPECT_NE(staged[local_slot(s, table[4])], nullptr);
      }
    }
    // Staged tokens read back exactly, sealed ones within the codec's bound, in every layer.
    for (int l = 0; l < 3; ++l) {
      for (int t = 0; t < 18; ++t) {
        const TokenKv x = read_at(s, l, table, t);
        for (int r : {0, 1}) {
          const std::string what =
              "layer " + std::to_string(l) + " token " + std::to_string(t) + " role " + std::to_string(r);
          if (t >= 12 && is_kivi(r == 0 ? kt : vt)) {
            ASSERT_EQ(x.role(r), values(t, l, r)) << what;
            continue;
          }
          std::vector<float> block;
          for (int u = t / kBs * kBs; u < t / kBs * kBs + kBs; ++u) {
            const std::vector<float> y = values(u, l, r);
            block.insert(block.end(), y.begin(), y.end());
          }
          expect_within(r == 0 ? kt : vt, r == 0 ? KvRole::kKey : KvRole::kValue, block, t % kBs, values(t, l, r),
                        x.role(r), what);
        }
      }
    }
    std::vector<TokenKv> sealed_before;  // local layer 0, tokens [0, 12)
    for (int t = 0; t < 12; ++t) sealed_before.push_back(read_at(s, 0, table, t));
    std::vector<TokenKv> global_before;  // the global layer, tokens [12, 16)
    for (int t = 12; t < 16; ++t) global_before.push_back(read_at(s, 1, table, t));

    // The window passes blocks 0..2 (sealed): retained, their bytes intact.
    for (int j = 0; j < 3; ++j) s.unpin_local_block(BlockId(table[static_cast<size_t>(j)]));
    EXPECT_EQ(s.local_blocks_retained(), 3);
    for (int t = 0; t < 12; ++t) {
      EXPECT_EQ(read_at(s, 0, table, t).k, sealed_before[static_cast<size_t>(t)].k) << t;
      EXPECT_EQ(read_at(s, 0, table, t).v, sealed_before[static_cast<size_t>(t)].v) << t;
    }

    // Block 3 (staged) shared by a second pin: losing one pin changes nothing.
    const int32_t slot3 = local_slot(s, table[3]);
    ASSERT_TRUE(s.pin_local_block(BlockId(table[3])));
    s.unpin_local_block(BlockId(table[3]));
    EXPECT_TRUE(s.is_staged(0, BlockId(table[3])));
    // Its last pin goes: slot and staging back at once, not retained.
    const size_t staging = s.staging_bytes();
    s.unpin_local_block(BlockId(table[3]));
    EXPECT_FALSE(s.local_block_cached(BlockId(table[3])));
    EXPECT_EQ(s.local_blocks_retained(), 3);
    EXPECT_EQ(s.local_blocks_in_use(), 1);
    for (int l : kLocalLayers) {
      EXPECT_FALSE(s.is_staged(l, BlockId(table[3])));
      for (const float* const* staged : {s.k_staged_table(l), s.v_staged_table(l)}) {
        if (staged != nullptr) {
          EXPECT_EQ(staged[slot3], nullptr) << "layer " << l;
        }
      }
    }
    // The global layer keeps its staged block (release_blocks is the owner's call there).
    EXPECT_TRUE(s.is_staged(1, BlockId(table[3])));
    for (int t = 12; t < 16; ++t) {
      const TokenKv x = read_at(s, 1, table, t);
      EXPECT_EQ(x.k, global_before[static_cast<size_t>(t - 12)].k) << t;
      EXPECT_EQ(x.v, global_before[static_cast<size_t>(t - 12)].v) << t;
    }
    // The freed slot is taken before any retained one, and its buffers serve the next block.
    ASSERT_TRUE(s.pin_local_block(BlockId(19)));
    EXPECT_EQ(local_slot(s, 19), slot3);
    for (int j = 0; j < 3; ++j) EXPECT_TRUE(s.local_block_cached(BlockId(table[static_cast<size_t>(j)])));
    const std::vector<int32_t> other = {19};
    write_sequence(s, other, 0, 2, {0, 2});
    EXPECT_EQ(s.staging_bytes(), staging);
    EXPECT_TRUE(s.is_staged(0, BlockId(19)));
    const TokenKv x = read(s, 2, BlockId(19), 1);
    if (is_kivi(kt)) {
      EXPECT_EQ(x.k, values(1, 2, 0));
    }
    if (is_kivi(vt)) {
      EXPECT_EQ(x.v, values(1, 2, 1));
    }
    // The tail goes the same way.
    s.unpin_local_block(BlockId(table[4]));
    EXPECT_FALSE(s.local_block_cached(BlockId(table[4])));
    EXPECT_EQ(s.local_blocks_in_use(), 1);
    EXPECT_EQ(s.local_blocks_retained(), 3);
  }
}

// copy_block copies a local layer only when the source holds a slot, into a pinned destination;
// staged KIVI sources make the destination staged there as in the global layers.
TEST(KvStorageLocalLayers, CopyBlockCopiesLocalLayersOnlyFromBlocksWithSlots) {
  for (const auto& [kt, vt] : {std::pair{KvType::kF32, KvType::kF32}, std::pair{KvType::kKivi4, KvType::kKivi4}}) {
    SCOPED_TRACE(types_name(kt, vt));
    KvStorage s(kLayout, kt, vt, 10, local_options(5));
    const bool kivi = is_kivi(kt);
    // Block 1: full and sealed; block 2: one token, staged (KIVI).
    for (int b : {1, 2, 3, 4}) ASSERT_TRUE(s.pin_local_block(BlockId(b)));
    write_block(s, 1, 0, 4);
    for (int l = 0; l < 3; ++l) s.seal_block(l, BlockId(1));
    write_block(s, 2, 100, 1);
    // Destinations 3 (staged, KIVI) and 4 (sealed) hold other tokens.
    write_block(s, 3, 200, 3);
    write_block(s, 4, 300, 4);
    for (int l = 0; l < 3; ++l) s.seal_block(l, BlockId(4));
    s.copy_block(BlockId(1), BlockId(3));
    s.copy_block(BlockId(2), BlockId(4));
    for (int l = 0; l < 3; ++l) {
      for (int slot = 0; slot < kBs; ++slot) {
        EXPECT_EQ(read(s, l, BlockId(3), slot).k, read(s, l, BlockId(1), slot).k) << "layer " << l << " slot " << slot;
        EXPECT_EQ(read(s, l, BlockId(3), slot).v, read(s, l, BlockId(1), slot).v) << "layer " << l << " slot " << slot;
      }
      EXPECT_EQ(read(s, l, BlockId(4), 0).k, read(s, l, BlockId(2), 0).k) << "layer " << l;
      EXPECT_EQ(read(s, l, BlockId(4), 0).v, values(100, l, 1)) << "layer " << l;  // staged or f32: exact
      EXPECT_FALSE(s.is_staged(l, BlockId(3))) << "layer " << l;
      EXPECT_EQ(s.is_staged(l, BlockId(4)), kivi) << "layer " << l;
    }
    // A retained source still holds its bytes: they are copied.
    s.unpin_local_block(BlockId(1));
    ASSERT_TRUE(s.pin_local_block(BlockId(5)));
    s.copy_block(BlockId(1), BlockId(5));
    for (int l = 0; l < 3; ++l) EXPECT_EQ(read(s, l, BlockId(5), 3).k, read(s, l, BlockId(1), 3).k) << "layer " << l;
    // A source with no slot (written only in the global layer): the local layers are skipped,
    // and the unpinned destination needs no slot.
    const std::vector<float> x(kWidth, 2.0f);
    s.write_token(1, BlockId(6), 0, x.data(), x.data());
    s.seal_block(1, BlockId(6));
    s.copy_block(BlockId(6), BlockId(7));
    EXPECT_FALSE(s.local_block_cached(BlockId(7)));
    EXPECT_EQ(read(s, 1, BlockId(7), 0).k, read(s, 1, BlockId(6), 0).k);
  }
}

TEST(KvStorageLocalLayersDeathTest, CopyBlockFromABlockWithASlotNeedsAPinnedDestination) {
  KvStorage s(kLayout, KvType::kF16, KvType::kF16, 8, local_options(3));
  ASSERT_TRUE(s.pin_local_block(BlockId(1)));
  ASSERT_TRUE(s.pin_local_block(BlockId(2)));
  s.unpin_local_block(BlockId(2));  // retained: holds a slot, but no pin
  EXPECT_DEATH(s.copy_block(BlockId(1), BlockId(3)), "block 3 is written in local layer 0 without a pin");
  EXPECT_DEATH(s.copy_block(BlockId(1), BlockId(2)), "block 2 is written in local layer 0 without a pin");
}

// ---- Compaction ----

struct CompactCase {
  KvType k_type, v_type;
  std::vector<int> kept;
  int local_first_kept;
};

// A 22-token sequence in 6 blocks, compacted to `kept`. The global layer (1) reads back exactly
// what a storage without local layers reads after the same compaction (the existing global
// semantics). The local layers read back kept tokens from local_first_kept on: per-token codecs
// exactly, KIVI exactly where the block ends staged, else within the codec's bound over what the
// block then holds (tokens before local_first_kept in its first block keep what they held).
// Local blocks wholly before local_first_kept hold no slot at all: compaction must not touch them.
void run_compact_case(const CompactCase& c) {
  const int num_tokens = 22;
  const int n = static_cast<int>(c.kept.size());
  const int lfk = c.local_first_kept;
  const bool kivi = is_kivi(c.k_type) || is_kivi(c.v_type);
  const KvStorageOptions local = local_options(/*local_slots=*/6, /*residual_tokens=*/4);
  KvStorage s(kLayout, c.k_type, c.v_type, 16, local);
  KvStorage plain(kLayout, c.k_type, c.v_type, 16, {.kivi_residual_tokens = 4});
  const std::vector<int32_t> table = {9, 2, 14, 5, 0, 11};
  for (int32_t b : table) ASSERT_TRUE(s.pin_local_block(BlockId(b)));
  for (KvStorage* st : {&s, &plain}) {
    write_sequence(*st, table, 0, 9);
    write_sequence(*st, table, 9, 13);
  }
  std::vector<std::vector<TokenKv>> before(3);  // [layer][token]
  for (int l = 0; l < 3; ++l) {
    for (int t = 0; t < num_tokens; ++t) before[static_cast<size_t>(l)].push_back(read_at(s, l, table, t));
  }
  // The window has left the blocks wholly before local_first_kept: unpinned, their slots then
  // taken by other blocks (every slot is in use, so the pins reclaim them).
  const int first_local_block = lfk / kBs;
  for (int j = 0; j < first_local_block; ++j) s.unpin_local_block(BlockId(table[static_cast<size_t>(j)]));
  const int32_t fillers[] = {15, 13, 12, 10, 8};  // ids outside the table
  for (int j = 0; j < first_local_block; ++j) ASSERT_TRUE(s.pin_local_block(BlockId(fillers[j])));
  for (int j = 0; j < first_local_block; ++j) {
    ASSERT_FALSE(s.local_block_cached(BlockId(table[static_cast<size_t>(j)])));
  }

  s.compact(table, c.kept, lfk);
  plain.compact(table, c.kept);

  // The global layer: as without local layers, bit for bit, and staged alike.
  for (int i = 0; i < n; ++i) {
    const TokenKv got = read_at(s, 1, table, i), want = read_at(plain, 1, table, i);
    ASSERT_EQ(got.k, want.k) << "global layer, token " << i;
    ASSERT_EQ(got.v, want.v) << "global layer, token " << i;
  }
  for (int32_t b : table) EXPECT_EQ(s.is_staged(1, BlockId(b)), plain.is_staged(1, BlockId(b))) << "block " << b;
  for (int i = 0; i < n && !kivi; ++i) {
    ASSERT_EQ(read_at(s, 1, table, i).k, before[1][static_cast<size_t>(c.kept[static_cast<size_t>(i)])].k) << i;
  }

  // The local layers, from local_first_kept on.
  const int sealed_end = std::max(0, n / kBs - s.residual_blocks());
  for (int l : kLocalLayers) {
    for (int i = lfk; i < n; ++i) {
      const int t = c.kept[static_cast<size_t>(i)];
      const TokenKv got = read_at(s, l, table, i);
      const TokenKv& want = before[static_cast<size_t>(l)][static_cast<size_t>(t)];
      const int j = i / kBs;
      const BlockId block(table[static_cast<size_t>(j)]);
      for (int r : {0, 1}) {
        const KvType type = r == 0 ? c.k_type : c.v_type;
        const std::string what = "local layer " + std::to_string(l) + " token " + std::to_string(i) + " (was " +
                                 std::to_string(t) + ") role " + std::to_string(r);
        // Exact: per-token rows copied, a staged block, or a sealed block inside the new residual
        // window (which compaction did not write: a destination there ends staged).
        if (!is_kivi(type) || s.is_staged(l, block) || j >= sealed_end) {
          ASSERT_EQ(got.role(r), want.role(r)) << what;
          continue;
        }
        // What the block held when it was sealed: the moved tokens, and before local_first_kept
        // what its slots held already.
        std::vector<float> block_values;
        for (int u = j * kBs; u < j * kBs + kBs; ++u) {
          const int src = u >= lfk ? c.kept[static_cast<size_t>(u)] : u;
          const std::vector<float>& y = before[static_cast<size_t>(l)][static_cast<size_t>(src)].role(r);
          block_values.insert(block_values.end(), y.begin(), y.end());
        }
        expect_within(type, r == 0 ? KvRole::kKey : KvRole::kValue, block_values, i % kBs, want.role(r), got.role(r),
                      what);
      }
    }
  }

  // The caller truncates: the entries after the new end lose their pins; staged ones there give
  // their slots back, sealed ones are retained.
  const int new_blocks = (n + kBs - 1) / kBs;
  for (size_t j = static_cast<size_t>(new_blocks); j < table.size(); ++j) {
    const BlockId b(table[j]);
    const bool staged = s.is_staged(0, b) || s.is_staged(2, b);
    s.unpin_local_block(b);
    EXPECT_EQ(s.local_block_cached(b), !staged) << "entry " << j;
  }
  // Pinned now: the fillers (one per entry before first_local_block) and entries [first_local_block, new_blocks).
  EXPECT_EQ(s.local_blocks_in_use(), new_blocks);
}

std::vector<int> kept_tokens() { return {0, 1, 5, 6, 9, 13, 16, 17, 18, 19, 20, 21}; }  // sinks, a middle, the recent 6

TEST(KvStorageLocalLayers, CompactMovesLocalLayersFromLocalFirstKept) {
  for (const auto& [kt, vt] : {std::pair{KvType::kF32, KvType::kF32}, std::pair{KvType::kInt8, KvType::kInt8},
                               std::pair{KvType::kKivi4, KvType::kKivi4}}) {
    for (int lfk : {0, 5, 6, 9, 12}) {
      SCOPED_TRACE(types_name(kt, vt) + " local_first_kept " + std::to_string(lfk));
      run_compact_case({kt, vt, kept_tokens(), lfk});
      if (testing::Test::HasFatalFailure()) return;
    }
  }
}

// Random keep lists (a few sinks, a random middle, a recent window) and local_first_kept.
TEST(KvStorageLocalLayers, CompactRandomKeepLists) {
  for (const auto& [kt, vt] : {std::pair{KvType::kF32, KvType::kF32}, std::pair{KvType::kInt8, KvType::kInt8},
                               std::pair{KvType::kKivi4, KvType::kKivi4}, std::pair{KvType::kKivi4, KvType::kInt8}}) {
    for (uint32_t seed = 0; seed < 6; ++seed) {
      std::mt19937 rng(seed);
      std::vector<int> kept;
      const int sinks = std::uniform_int_distribution<int>(0, 3)(rng);
      const int window = std::uniform_int_distribution<int>(1, 8)(rng);
      const double p = std::uniform_real_distribution<double>(0.1, 0.9)(rng);
      for (int t = 0; t < 22; ++t) {
        if (t < sinks || t >= 22 - window || std::bernoulli_distribution(p)(rng)) kept.push_back(t);
      }
      const int lfk = std::uniform_int_distribution<int>(0, static_cast<int>(kept.size()))(rng);
      SCOPED_TRACE(types_name(kt, vt) + " seed " + std::to_string(seed) + " kept " + std::to_string(kept.size()) +
                   " local_first_kept " + std::to_string(lfk));
      run_compact_case({kt, vt, kept, lfk});
      if (testing::Test::HasFatalFailure()) return;
    }
  }
}

// A destination block that compaction pins anew (LocalWindowHold::widen) may get a slot that held
// another block's bytes. Its slots before local_first_kept are outside every later window, but
// KIVI keys are quantized per channel over the whole block, so what those slots hold must not
// widen the kept tokens' ranges (before the fix those slots kept the old bytes, and the kept keys
// read back over 10x the bound off).
TEST(KvStorageLocalLayers, CompactIntoAReclaimedSlotKeepsTheKiviBound) {
  KvStorage s(kLayout, KvType::kKivi4, KvType::kKivi4, 16, local_options(3, /*residual_tokens=*/0));
  const std::vector<int32_t> table = {1, 2, 3};
  for (int32_t b : table) ASSERT_TRUE(s.pin_local_block(BlockId(b)));
  write_sequence(s, table, 0, 12);  // residual 0: every full block sealed
  std::vector<TokenKv> before;
  for (int t = 0; t < 12; ++t) before.push_back(read_at(s, 0, table, t));
  // The window leaves blocks 1 and 2; block 9 takes 1's slot and is written with keys of range 100.
  s.unpin_local_block(BlockId(1));
  s.unpin_local_block(BlockId(2));
  ASSERT_TRUE(s.pin_local_block(BlockId(9)));
  for (int slot = 0; slot < kBs; ++slot) {
    const std::vector<float> wide(kWidth, slot % 2 == 0 ? 50.0f : -50.0f);
    for (int l : kLocalLayers) s.write_token(l, BlockId(9), slot, wide.data(), wide.data());
  }
  for (int l : kLocalLayers) s.seal_block(l, BlockId(9));
  s.unpin_local_block(BlockId(9));                  // retained, after block 2
  ASSERT_TRUE(s.pin_local_block(BlockId(10)));      // takes block 2's slot
  ASSERT_TRUE(s.pin_local_block(BlockId(2)));       // widen: block 2 takes block 9's slot
  ASSERT_EQ(s.local_blocks_in_use(), 3);
  // Tokens 9..11 move to indices 5..7 (block 2's slots 1..3); local_first_kept 5.
  const std::vector<int> kept = {0, 1, 2, 3, 4, 9, 10, 11};
  s.compact(table, kept, 5);
  ASSERT_FALSE(s.is_staged(0, BlockId(2)));
  // The bound over the block's live tokens (its dead slot counted as a copy of the first live one).
  auto key_before = [&](int i) -> const std::vector<float>& {
    return before[static_cast<size_t>(kept[static_cast<size_t>(i)])].k;
  };
  std::vector<float> live;
  for (int i : {5, 5, 6, 7}) live.insert(live.end(), key_before(i).begin(), key_before(i).end());
  for (int i = 5; i < 8; ++i) {
    expect_within(KvType::kKivi4, KvRole::kKey, live, i % kBs, key_before(i), read_at(s, 0, table, i).k,
                  "token " + std::to_string(i));
  }
}

TEST(KvStorageLocalLayersDeathTest, CompactNeedsLocalFirstKeptAndPinnedDestinations) {
  KvStorage s(kLayout, KvType::kF32, KvType::kF32, 8, local_options(4));
  const std::vector<int32_t> table = {3, 1, 6};
  for (int32_t b : table) ASSERT_TRUE(s.pin_local_block(BlockId(b)));
  write_sequence(s, table, 0, 10);
  const std::vector<int> kept = {0, 7, 8, 9};
  EXPECT_DEATH(s.compact(table, kept), "local_first_kept -1 outside \\[0, 4\\]");
  EXPECT_DEATH(s.compact(table, kept, 5), "local_first_kept 5 outside");
  s.unpin_local_block(BlockId(3));  // token 0's block, where kept tokens 0..3 land
  EXPECT_DEATH(s.compact(table, kept, 1), "block 3 is written in local layer 0 without a pin");
  s.compact(table, kept, 4);  // nothing moves on the local layers: no pin needed
  EXPECT_EQ(read_at(s, 1, table, 1).k, values(7, 1, 0));
}

}  // namespace
}  // namespace kvlm
