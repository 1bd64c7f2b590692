#include "kv/kv_storage.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace kvlm {
namespace {

const KvLayout kSmall{.num_layers = 2, .num_kv_heads = 4, .head_dim = 8, .block_size = 16};

TEST(KvStorage, AccountsBytesByFormula) {
  struct Case {
    KvType k, v;
    size_t k_bytes, v_bytes;  // per value
  };
  for (const Case c : {Case{KvType::kF32, KvType::kF32, 4, 4}, Case{KvType::kF16, KvType::kF16, 2, 2},
                       Case{KvType::kF32, KvType::kF16, 4, 2}}) {
    KvStorage s(kSmall, c.k, c.v, 10);
    // 2 × layers × kv_heads × head_dim × bytes per value, split between K and V.
    const size_t per_token = 2u * 4 * 8 * (c.k_bytes + c.v_bytes);
    EXPECT_EQ(s.bytes_per_token(), per_token);
    EXPECT_EQ(s.bytes_per_block(), per_token * 16);
    EXPECT_EQ(s.allocated_bytes(), per_token * 16 * 10);
    EXPECT_EQ(s.k_block_bytes(), 16u * 4 * 8 * c.k_bytes);
    EXPECT_EQ(s.v_block_bytes(), 16u * 4 * 8 * c.v_bytes);
    EXPECT_EQ(s.num_blocks(), 10);
    EXPECT_EQ(s.layout().head_dim, 8);
    EXPECT_EQ(s.k_type(), c.k);
    EXPECT_EQ(s.v_type(), c.v);
  }
  // A llama-3.2-1b-shaped cache: 16 layers × 8 kv heads × 64 × 2 (K, V) × 2 bytes = 32 KiB per token.
  KvStorage llama({.num_layers = 16, .num_kv_heads = 8, .head_dim = 64, .block_size = 16}, KvType::kF16, KvType::kF16,
                  4);
  EXPECT_EQ(llama.bytes_per_token(), 32768u);
}

TEST(KvStorage, BlocksAreArenaSlicesAndAligned) {
  KvStorage s(kSmall, KvType::kF16, KvType::kF32, 5);
  for (int layer = 0; layer < 2; ++layer) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(s.k_arena(layer)) % 64, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(s.v_arena(layer)) % 64, 0u);
    for (int b = 0; b < 5; ++b) {
      EXPECT_EQ(s.k_block(layer, BlockId(b)), s.k_arena(layer) + b * s.k_block_bytes());
      EXPECT_EQ(s.v_block(layer, BlockId(b)), s.v_arena(layer) + b * s.v_block_bytes());
    }
  }
  EXPECT_NE(s.k_arena(0), s.k_arena(1));
}

// Every (layer, block, slot) gets distinct values; reading all back after writing
// all proves no two addresses alias.
TEST(KvStorage, WriteThenReadEveryTokenOfEveryLayer) {
  for (KvType type : {KvType::kF32, KvType::kF16}) {
    const int num_blocks = 3;
    KvStorage s(kSmall, type, type, num_blocks);
    const size_t width = kSmall.values_per_token();
    auto value = [&](int layer, int block, int slot, size_t i, int kv) {
      // Small integers and halves are exact in f16.
      return static_cast<float>(((layer * 7 + block * 5 + slot * 3 + static_cast<int>(i) + kv * 11) % 97) - 48) * 0.5f;
    };
    std::vector<float> k(width), v(width);
    for (int layer = 0; layer < 2; ++layer) {
      for (int block = 0; block < num_blocks; ++block) {
        for (int slot = 0; slot < kSmall.block_size; ++slot) {
          for (size_t i = 0; i < width; ++i) {
            k[i] = value(layer, block, slot, i, 0);
            v[i] = value(layer, block, slot, i, 1);
          }
          s.write_token(layer, BlockId(block), slot, k.data(), v.data());
        }
      }
    }
    for (int layer = 0; layer < 2; ++layer) {
      for (int block = 0; block < num_blocks; ++block) {
        for (int slot = 0; slot < kSmall.block_size; ++slot) {
          s.read_token(layer, BlockId(block), slot, k.data(), v.data());
          for (size_t i = 0; i < width; ++i) {
            ASSERT_EQ(k[i], value(layer, block, slot, i, 0)) << layer << " " << block << " " << slot << " " << i;
            ASSERT_EQ(v[i], value(layer, block, slot, i, 1)) << layer << " " << block << " " << slot << " " << i;
          }
        }
      }
    }
  }
}

TEST(KvStorage, F16StorageRoundsToNearestHalf) {
  KvStorage s(kSmall, KvType::kF16, KvType::kF16, 1);
  std::vector<float> k(kSmall.values_per_token()), v(k.size()), k2(k.size()), v2(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = 0.1f * static_cast<float>(i) + 1e-4f;
    v[i] = -3.3f / static_cast<float>(i + 1);
  }
  s.write_token(1, BlockId(0), 5, k.data(), v.data());
  s.read_token(1, BlockId(0), 5, k2.data(), v2.data());
  for (size_t i = 0; i < k.size(); ++i) {
    EXPECT_EQ(k2[i], fp16_to_fp32(fp32_to_fp16(k[i])));
    EXPECT_EQ(v2[i], fp16_to_fp32(fp32_to_fp16(v[i])));
  }
}

TEST(KvStorage, CreateRejectsBadAndAbsurdSizes) {
  auto bad = [](const KvLayout& layout, int num_blocks) {
    auto r = KvStorage::create(layout, KvType::kF16, KvType::kF16, num_blocks);
    EXPECT_FALSE(r.ok());
    return r.status().message();
  };
  EXPECT_NE(bad(kSmall, 0).find("at least one block"), std::string::npos);
  EXPECT_NE(bad({.num_layers = 2, .num_kv_heads = 0, .head_dim = 8, .block_size = 16}, 4).find("num_kv_heads=0"),
            std::string::npos);
  EXPECT_NE(bad({.num_layers = 2, .num_kv_heads = 8, .head_dim = -64, .block_size = 16}, 4).find("invalid KV layout"),
            std::string::npos);
  // Overflowing products.
  EXPECT_NE(bad({.num_layers = 1, .num_kv_heads = 1 << 30, .head_dim = 1 << 30, .block_size = 1 << 30}, 1)
                .find("too large"),
            std::string::npos);
  // Representable, but far beyond any machine: 1000 layers × 2^30 blocks.
  const std::string absurd = bad({.num_layers = 1000, .num_kv_heads = 8, .head_dim = 128, .block_size = 16}, 1 << 30);
  EXPECT_NE(absurd.find("GiB"), std::string::npos) << absurd;

  auto ok = KvStorage::create(kSmall, KvType::kF32, KvType::kF16, 4);
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ((*ok)->num_blocks(), 4);
}

TEST(KvStorageDeathTest, ConstructorAbortsOnBadSizesAndAccessOutOfRange) {
  EXPECT_DEATH(KvStorage(kSmall, KvType::kF32, KvType::kF32, 0), "at least one block");
  KvStorage s(kSmall, KvType::kF32, KvType::kF32, 2);
  std::vector<float> k(kSmall.values_per_token()), v(k.size());
  EXPECT_DEATH(s.write_token(0, BlockId(2), 0, k.data(), v.data()), "block 2 out of range");
  EXPECT_DEATH(s.write_token(2, BlockId(0), 0, k.data(), v.data()), "layer 2 out of range");
  EXPECT_DEATH(s.read_token(0, BlockId(0), 16, k.data(), v.data()), "slot 16 out of range");
}

}  // namespace
}  // namespace kvlm
