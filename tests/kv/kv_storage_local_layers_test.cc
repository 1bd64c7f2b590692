// KvStorage with sliding-window (local) layers: their arenas hold only the slots blocks take
// while inside a window, mapped from block ids; bytes, release and refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kv/kv_storage.h"

namespace kvlm {
namespace {

// 3 layers: 0 and 2 local, 1 global; 4 tokens per block.
const KvLayout kLayout{.num_layers = 3, .num_kv_heads = 2, .head_dim = 8, .block_size = 4};

KvStorageOptions local_options(int local_slots) {
  KvStorageOptions o;
  o.local_layers = {1, 0, 1};
  o.local_num_blocks = local_slots;
  return o;
}

std::vector<float> token_values(int token, int layer, float sign) {
  std::vector<float> v(16);
  for (size_t i = 0; i < v.size(); ++i) v[i] = sign * (static_cast<float>(token * 100 + layer * 10) + 0.5f * i);
  return v;
}

TEST(KvStorageLocalLayers, ArenasAndBytesFollowTheLayerGroups) {
  KvStorage s(kLayout, KvType::kF32, KvType::kF32, 20, local_options(5));
  ASSERT_TRUE(s.has_local_layers());
  EXPECT_EQ(s.num_local_layers(), 2);
  EXPECT_TRUE(s.is_local_layer(0));
  EXPECT_FALSE(s.is_local_layer(1));
  EXPECT_EQ(s.num_blocks(), 20);
  EXPECT_EQ(s.num_blocks(1), 20);
  EXPECT_EQ(s.num_blocks(0), 5);
  // One layer-block: 4 tokens × 2 heads × 8 × 4 bytes, K and V: 512 bytes.
  EXPECT_EQ(s.bytes_per_block(), 512u);        // the one global layer
  EXPECT_EQ(s.local_bytes_per_block(), 1024u);  // the two local layers
  EXPECT_EQ(s.allocated_bytes(), 512u * 20 + 1024u * 5);
  EXPECT_EQ(s.bytes_per_token(), 3u * 128);      // every layer's bytes for a token (full-cache formula)
  EXPECT_EQ(s.used_bytes(3), 512u * 3);          // no local slot taken yet
}

TEST(KvStorageLocalLayers, BlocksTakeSlotsWhenWrittenAndReadBackThroughThem) {
  KvStorage s(kLayout, KvType::kF32, KvType::kF32, 20, local_options(3));
  const std::vector<int32_t> table = {7, 2, 19, 11};  // 16 tokens
  for (int t = 0; t < 12; ++t) {
    for (int l = 0; l < 3; ++l) {
      s.write_token(l, BlockId(table[t / 4]), t % 4, token_values(t, l, 1).data(), token_values(t, l, -1).data());
    }
  }
  EXPECT_EQ(s.local_blocks_in_use(), 3);
  std::vector<int32_t> local(4, -5);
  s.local_block_table(table, 0, 4, local.data());
  EXPECT_EQ(local[0], 0);  // slots are handed out in order of first write
  EXPECT_EQ(local[1], 1);
  EXPECT_EQ(local[2], 2);
  EXPECT_EQ(local[3], -1);  // never written
  std::vector<float> k(16), v(16);
  for (int t = 0; t < 12; ++t) {
    for (int l = 0; l < 3; ++l) {
      s.read_token(l, BlockId(table[t / 4]), t % 4, k.data(), v.data());
      EXPECT_EQ(k, token_values(t, l, 1)) << "token " << t << " layer " << l;
      EXPECT_EQ(v, token_values(t, l, -1)) << "token " << t << " layer " << l;
    }
  }
  // The window moved past tokens [0, 8): blocks 7 and 2 leave the local layers, not the global one.
  s.release_local_blocks_before(table, 9);  // token 8 is needed: block 2 (tokens 4..7) goes, 19 stays
  EXPECT_EQ(s.local_blocks_in_use(), 1);
  s.local_block_table(table, 0, 3, local.data());
  EXPECT_EQ(local[0], -1);
  EXPECT_EQ(local[1], -1);
  EXPECT_EQ(local[2], 2);
  s.read_token(1, BlockId(7), 1, k.data(), v.data());  // the global layer keeps everything
  EXPECT_EQ(k, token_values(1, 1, 1));
  // A freed slot serves the next block written.
  s.write_token(0, BlockId(11), 0, token_values(12, 0, 1).data(), token_values(12, 0, -1).data());
  s.local_block_table(table, 3, 1, local.data());
  EXPECT_TRUE(local[0] == 0 || local[0] == 1);
  EXPECT_EQ(s.peak_local_blocks_in_use(), 3);
  // The sequence ends: every slot it holds goes back.
  s.release_blocks(table);
  EXPECT_EQ(s.local_blocks_in_use(), 0);
}

TEST(KvStorageLocalLayersDeathTest, ReadingABlockThatLeftTheWindowAborts) {
  KvStorage s(kLayout, KvType::kF16, KvType::kF16, 8, local_options(2));
  const std::vector<float> x(16, 1.0f);
  s.write_token(0, BlockId(3), 0, x.data(), x.data());
  const std::vector<int32_t> table = {3, 4};
  s.release_local_blocks_before(table, 4);
  std::vector<float> k(16), v(16);
  EXPECT_DEATH(s.read_token(0, BlockId(3), 0, k.data(), v.data()), "left the window");
}

TEST(KvStorageLocalLayersDeathTest, RunningOutOfSlotsAbortsNamingTheSizing) {
  KvStorage s(kLayout, KvType::kF16, KvType::kF16, 8, local_options(1));
  const std::vector<float> x(16, 1.0f);
  s.write_token(0, BlockId(0), 0, x.data(), x.data());
  EXPECT_DEATH(s.write_token(0, BlockId(1), 0, x.data(), x.data()), "all in use");
}

TEST(KvStorageLocalLayers, WhatCannotCombineIsAnError) {
  auto kivi = KvStorage::create(kLayout, KvType::kKivi4, KvType::kF16, 8, local_options(2));
  ASSERT_FALSE(kivi.ok());
  EXPECT_NE(kivi.status().message().find("KIVI"), std::string::npos) << kivi.status().message();
  auto no_slots = KvStorage::create(kLayout, KvType::kF16, KvType::kF16, 8, local_options(0));
  ASSERT_FALSE(no_slots.ok());
  EXPECT_NE(no_slots.status().message().find("local_num_blocks"), std::string::npos);
  KvStorageOptions wrong = local_options(2);
  wrong.local_layers = {1, 0};
  auto mismatch = KvStorage::create(kLayout, KvType::kF16, KvType::kF16, 8, wrong);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.status().message().find("2 local-layer flags for 3 layers"), std::string::npos);
  // All flags 0: a plain storage.
  KvStorageOptions none = local_options(2);
  none.local_layers = {0, 0, 0};
  auto plain = KvStorage::create(kLayout, KvType::kF16, KvType::kF16, 8, none);
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE((*plain)->has_local_layers());
}

TEST(KvStorageLocalLayers, BlocksPerSequenceCoverTheWindowAndTheStep) {
  // Window 24, one decode token: 24 tokens may straddle 7 blocks of 4 (ceil(24/4) + 1).
  EXPECT_EQ(KvStorage::local_blocks_per_sequence(24, 4, 1), 7);
  // A step of 8 tokens: its first query sees 23 earlier ones, 31 tokens: ceil(31/4) + 1 = 9.
  EXPECT_EQ(KvStorage::local_blocks_per_sequence(24, 4, 8), 9);
  EXPECT_EQ(KvStorage::local_blocks_per_sequence(512, 16, 1), 33);
}

}  // namespace
}  // namespace kvlm
