// KvStorage with a latent layout (MLA): one row per token and layer, no V arena, the value a prefix of the row.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kv/hadamard.h"
#include "kv/kv_block_format.h"
#include "kv/kv_codec.h"
#include "kv/kv_storage.h"

namespace kvlm {
namespace {

// DeepSeek-V2-Lite's row: a 512-value latent and a 64-value RoPE key.
KvLayout deepseek_layout(int num_layers = 3, int block_size = 16) {
  return KvLayout{.num_layers = num_layers, .num_kv_heads = 1, .head_dim = 576, .block_size = block_size,
                  .latent_value_dim = 512};
}

// A small row: 48 values, the first 32 the value (rotation blocks of 16 tile it).
KvLayout small_layout(int block_size = 4) {
  return KvLayout{.num_layers = 3, .num_kv_heads = 1, .head_dim = 48, .block_size = block_size,
                  .latent_value_dim = 32};
}

constexpr KvType kLatentTypes[] = {KvType::kF32, KvType::kF16, KvType::kBf16,
                                   KvType::kFp8, KvType::kInt8, KvType::kInt4};

std::vector<float> random_row(int width, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(width));
  for (float& e : x) e = normal(rng);
  return x;
}

// Every layer's decoded row of one token: [num_layers, head_dim].
std::vector<float> read_rows(const KvStorage& s, BlockId block, int slot) {
  const size_t w = s.layout().values_per_token();
  std::vector<float> rows(static_cast<size_t>(s.layout().num_layers) * w);
  for (int layer = 0; layer < s.layout().num_layers; ++layer) {
    s.read_token(layer, block, slot, rows.data() + layer * w, nullptr);
  }
  return rows;
}

void write_rows(KvStorage& s, BlockId block, int slot, const std::vector<float>& rows) {
  const size_t w = s.layout().values_per_token();
  for (int layer = 0; layer < s.layout().num_layers; ++layer) {
    s.write_token(layer, block, slot, rows.data() + layer * w, nullptr);
  }
}

bool bits_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(KvStorageLatent, BytesCountTheRowOnceAndThereIsNoVArena) {
  // Per layer and token: the row's codes and the codec's scales, no V.
  struct Case {
    KvType type;
    size_t bytes_per_row;
  };
  const Case cases[] = {{KvType::kF32, 576 * 4},
                        {KvType::kF16, 576 * 2},
                        {KvType::kBf16, 576 * 2},
                        {KvType::kFp8, 576 + 2},                 // codes + an f16 scale
                        {KvType::kInt8, 576 + 2},
                        {KvType::kInt4, 576 / 2 + 576 / 32 * 4}};  // nibbles + (scale, min) per group of 32
  for (const Case& c : cases) {
    SCOPED_TRACE(kv_type_name(c.type));
    const KvLayout layout = deepseek_layout();
    KvStorage s(layout, c.type, c.type, 10);
    EXPECT_EQ(s.k_block_bytes(), 16 * c.bytes_per_row);
    EXPECT_EQ(s.k_block_bytes(), kv_codec(c.type).block_bytes(layout));
    EXPECT_EQ(s.v_block_bytes(), 0u);
    EXPECT_EQ(s.bytes_per_token(), 3 * c.bytes_per_row);
    EXPECT_EQ(s.bytes_per_block(), 3 * s.k_block_bytes());
    EXPECT_EQ(s.allocated_bytes(), 10 * s.bytes_per_block());
    EXPECT_EQ(s.used_bytes(4), 4 * s.bytes_per_block());
    EXPECT_EQ(kv_block_bytes(layout, c.type, c.type), s.k_block_bytes());
    EXPECT_EQ(s.v_type(), c.type);
    for (int layer = 0; layer < 3; ++layer) {
      // A reader asking for V reads the rows.
      EXPECT_EQ(s.v_arena(layer), s.k_arena(layer));
      EXPECT_EQ(s.v_block(layer, BlockId(7)), s.k_block(layer, BlockId(7)));
      EXPECT_EQ(s.v_staged_table(layer), nullptr);
    }
  }
  // f16 DeepSeek-V2-Lite: 27 layers × 576 × 2 bytes = 31,104 bytes per token (an f16 MHA cache of
  // its 16 heads × (192 + 128) would be 276,480).
  KvStorage lite(deepseek_layout(27), KvType::kF16, KvType::kF16, 2);
  EXPECT_EQ(lite.bytes_per_token(), 31104u);
}

TEST(KvStorageLatent, WriteReadRoundTripGivesTheRowAndItsPrefix) {
  std::mt19937 rng(3);
  for (KvType type : kLatentTypes) {
    for (const KvLayout& layout : {small_layout(), deepseek_layout()}) {
      SCOPED_TRACE(fmt::format("{} d{}", kv_type_name(type), layout.head_dim));
      KvStorage s(layout, type, type, 4);
      const bool rotated = type == KvType::kInt8 || type == KvType::kInt4;  // the default, and it fits
      EXPECT_EQ(s.keys_rotated(), rotated);
      const std::vector<float> row = random_row(layout.head_dim, rng);
      s.write_token(1, BlockId(2), 3, row.data(), nullptr);
      std::vector<float> k(static_cast<size_t>(layout.head_dim)), v(static_cast<size_t>(layout.value_dim()), NAN);
      s.read_token(1, BlockId(2), 3, k.data(), v.data());
      // The value is exactly the decoded row's prefix, in the model's space.
      for (int i = 0; i < layout.value_dim(); ++i) ASSERT_EQ(v[i], k[i]) << i;
      // The row within the codec's error (rotated rows: after the rotation back).
      float amax = 0.0f;
      for (float x : row) amax = std::max(amax, std::fabs(x));
      const float tol = type == KvType::kF32    ? 1e-6f * amax
                        : type == KvType::kF16  ? 1e-3f * amax
                        : type == KvType::kBf16 ? 8e-3f * amax
                        : type == KvType::kFp8  ? 0.07f * amax
                        : type == KvType::kInt8 ? 0.02f * amax
                                                : 0.5f * amax;
      for (int i = 0; i < layout.head_dim; ++i) ASSERT_NEAR(k[i], row[i], tol) << i;
      // K alone is fine too.
      std::vector<float> k_only(k.size());
      s.read_token(1, BlockId(2), 3, k_only.data(), nullptr);
      EXPECT_TRUE(bits_equal(k_only, k));
    }
  }
}

TEST(KvStorageLatent, RotatedF32RowsReadBackInTheModelSpace) {
  std::mt19937 rng(5);
  KvStorage s(deepseek_layout(), KvType::kF32, KvType::kF32, 2, {.rotate_keys = true});
  ASSERT_TRUE(s.keys_rotated());
  const std::vector<float> row = random_row(576, rng);
  s.write_token(0, BlockId(1), 0, row.data(), nullptr);
  // The arena holds the rotated row ...
  std::vector<float> rotated = row;
  hadamard_rotate_heads(rotated.data(), 1, 576);
  const float* stored = reinterpret_cast<const float*>(s.k_block(0, BlockId(1)));
  for (int i = 0; i < 576; ++i) ASSERT_EQ(stored[i], rotated[i]) << i;
  // ... whose value part is the rotated value, blocks of 64 tiling the first 512.
  std::vector<float> value(row.begin(), row.begin() + 512);
  hadamard_rotate_heads(value.data(), 512 / hadamard_block(576), hadamard_block(576));
  for (int i = 0; i < 512; ++i) ASSERT_NEAR(stored[i], value[i], 1e-5f) << i;
  // Readers see the model's space.
  std::vector<float> k(576), v(512);
  s.read_token(0, BlockId(1), 0, k.data(), v.data());
  for (int i = 0; i < 576; ++i) ASSERT_NEAR(k[i], row[i], 1e-5f) << i;
  for (int i = 0; i < 512; ++i) ASSERT_EQ(v[i], k[i]) << i;
}

TEST(KvStorageLatent, WriteTokensTakesNoValues) {
  std::mt19937 rng(9);
  const KvLayout layout = small_layout(4);
  KvStorage s(layout, KvType::kF32, KvType::kF32, 6);
  const std::vector<int32_t> table = {4, 1, 3};
  const int n = 10;
  std::vector<float> rows;
  for (int t = 0; t < n; ++t) {
    const std::vector<float> r = random_row(48, rng);
    rows.insert(rows.end(), r.begin(), r.end());
  }
  s.write_tokens(2, table, 0, 6, rows.data(), nullptr);
  s.write_tokens(2, table, 6, n - 6, rows.data() + 6 * 48, nullptr);
  std::vector<float> k(48), v(32);
  for (int t = 0; t < n; ++t) {
    s.read_token(2, BlockId(table[static_cast<size_t>(t / 4)]), t % 4, k.data(), v.data());
    for (int i = 0; i < 48; ++i) ASSERT_EQ(k[i], rows[static_cast<size_t>(t) * 48 + i]) << t;
    for (int i = 0; i < 32; ++i) ASSERT_EQ(v[i], rows[static_cast<size_t>(t) * 48 + i]) << t;
  }
}

TEST(KvStorageLatent, CopiesAndCompactionMoveRowsExactly) {
  for (KvType type : kLatentTypes) {
    SCOPED_TRACE(kv_type_name(type));
    std::mt19937 rng(11);
    const KvLayout layout = small_layout(4);
    KvStorage s(layout, type, type, 8);
    // Tokens 0..11 in blocks 5, 2, 7; every layer its own row.
    const std::vector<int32_t> table = {5, 2, 7};
    std::vector<std::vector<float>> written;
    for (int t = 0; t < 12; ++t) {
      std::vector<float> rows;
      for (int layer = 0; layer < 3; ++layer) {
        const std::vector<float> r = random_row(48, rng);
        rows.insert(rows.end(), r.begin(), r.end());
      }
      write_rows(s, BlockId(table[static_cast<size_t>(t / 4)]), t % 4, rows);
      written.push_back(read_rows(s, BlockId(table[static_cast<size_t>(t / 4)]), t % 4));
    }
    // copy_block: every layer's bytes.
    s.copy_block(BlockId(2), BlockId(0));
    for (int layer = 0; layer < 3; ++layer) {
      EXPECT_EQ(std::memcmp(s.k_block(layer, BlockId(0)), s.k_block(layer, BlockId(2)), s.k_block_bytes()), 0);
    }
    for (int slot = 0; slot < 4; ++slot) EXPECT_TRUE(bits_equal(read_rows(s, BlockId(0), slot), written[4 + slot]));
    // copy_token: one row, every layer.
    s.copy_token(BlockId(7), 1, BlockId(0), 3);
    EXPECT_TRUE(bits_equal(read_rows(s, BlockId(0), 3), written[9]));
    EXPECT_TRUE(bits_equal(read_rows(s, BlockId(0), 2), written[6]));
    // compact (H2O / SnapKV): the kept tokens become the first ones, in order, bit for bit.
    const std::vector<int> kept = {0, 2, 3, 6, 7, 10, 11};
    s.compact(table, kept);
    for (size_t i = 0; i < kept.size(); ++i) {
      EXPECT_TRUE(bits_equal(read_rows(s, BlockId(table[i / 4]), static_cast<int>(i % 4)),
                             written[static_cast<size_t>(kept[i])]))
          << "kept #" << i;
    }
  }
}

TEST(KvStorageLatent, LocalLayersKeepTheirRowsInLocalSlots) {
  std::mt19937 rng(13);
  const KvLayout layout = small_layout(4);
  KvStorageOptions options{.local_layers = {0, 1, 0}, .local_num_blocks = 2};
  KvStorage s(layout, KvType::kInt8, KvType::kInt8, 6, options);
  EXPECT_EQ(s.local_bytes_per_block(), s.k_block_bytes());  // one local layer, rows only
  EXPECT_EQ(s.allocated_bytes(), 2 * 6 * s.k_block_bytes() + 2 * s.k_block_bytes());
  ASSERT_TRUE(s.pin_local_block(BlockId(3)));
  ASSERT_TRUE(s.pin_local_block(BlockId(4)));
  std::vector<std::vector<float>> written;
  const std::vector<int32_t> table = {3, 4};
  for (int t = 0; t < 8; ++t) {
    std::vector<float> rows;
    for (int layer = 0; layer < 3; ++layer) {
      const std::vector<float> r = random_row(48, rng);
      rows.insert(rows.end(), r.begin(), r.end());
    }
    write_rows(s, BlockId(table[static_cast<size_t>(t / 4)]), t % 4, rows);
    written.push_back(read_rows(s, BlockId(table[static_cast<size_t>(t / 4)]), t % 4));
  }
  const std::vector<int> kept = {1, 2, 5, 7};
  s.compact(table, kept, /*local_first_kept=*/0);
  for (size_t i = 0; i < kept.size(); ++i) {
    EXPECT_TRUE(bits_equal(read_rows(s, BlockId(table[i / 4]), static_cast<int>(i % 4)),
                           written[static_cast<size_t>(kept[i])]))
        << "kept #" << i;
  }
}

TEST(KvStorageLatent, RotationOnlyWhereItsBlocksTileTheValue) {
  // head_dim 48: rotation blocks of 16, which tile a value of 32 but not one of 40.
  const KvLayout tiles = small_layout();
  KvLayout straddles = tiles;
  straddles.latent_value_dim = 40;
  EXPECT_TRUE(KvStorage(tiles, KvType::kInt8, KvType::kInt8, 1).keys_rotated());
  EXPECT_TRUE(KvStorage(tiles, KvType::kF16, KvType::kF16, 1, {.rotate_keys = true}).keys_rotated());
  EXPECT_FALSE(KvStorage(tiles, KvType::kInt8, KvType::kInt8, 1, {.rotate_keys = false}).keys_rotated());
  // The default resolves to off, and says so.
  EXPECT_FALSE(KvStorage(straddles, KvType::kInt8, KvType::kInt8, 1).keys_rotated());
  EXPECT_FALSE(KvStorage(straddles, KvType::kInt4, KvType::kInt4, 1).keys_rotated());
  EXPECT_FALSE(KvStorage(straddles, KvType::kInt8, KvType::kInt8, 1, {.rotate_keys = false}).keys_rotated());
  // Asked for explicitly, it is an error naming the sizes.
  auto r = KvStorage::create(straddles, KvType::kInt8, KvType::kInt8, 1, {.rotate_keys = true});
  ASSERT_FALSE(r.ok());
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("blocks of 16"), std::string::npos) << m;
  EXPECT_NE(m.find("head_dim 48"), std::string::npos) << m;
  EXPECT_NE(m.find("value_dim 40"), std::string::npos) << m;
  // 576 = 64 × 9: blocks of 64, which tile 512.
  EXPECT_TRUE(KvStorage(deepseek_layout(), KvType::kInt4, KvType::kInt4, 1).keys_rotated());
}

TEST(KvStorageLatent, CreateRejectsLayoutsAndTypesALatentCannotHave) {
  auto error = [](const KvLayout& layout, KvType k, KvType v) {
    auto r = KvStorage::create(layout, k, v, 4);
    EXPECT_FALSE(r.ok());
    return r.ok() ? std::string() : r.status().message();
  };
  KvLayout two_heads = small_layout();
  two_heads.num_kv_heads = 2;
  std::string m = error(two_heads, KvType::kF16, KvType::kF16);
  EXPECT_NE(m.find("num_kv_heads=2"), std::string::npos) << m;
  EXPECT_NE(m.find("num_kv_heads must be 1"), std::string::npos) << m;
  KvLayout too_wide = small_layout();
  too_wide.latent_value_dim = 49;
  m = error(too_wide, KvType::kF16, KvType::kF16);
  EXPECT_NE(m.find("latent_value_dim=49"), std::string::npos) << m;
  EXPECT_NE(m.find("<= head_dim"), std::string::npos) << m;
  KvLayout negative = small_layout();
  negative.latent_value_dim = -1;
  EXPECT_NE(error(negative, KvType::kF16, KvType::kF16).find("latent_value_dim=-1"), std::string::npos);
  for (KvType kivi : {KvType::kKivi4, KvType::kKivi2}) {
    m = error(small_layout(), kivi, kivi);
    EXPECT_NE(m.find(std::string(kv_type_name(kivi))), std::string::npos) << m;
    EXPECT_NE(m.find("KIVI"), std::string::npos) << m;
  }
  m = error(small_layout(), KvType::kInt8, KvType::kF16);
  EXPECT_NE(m.find("V type f16 must equal K type int8"), std::string::npos) << m;
  // validate_kv_layout says the same for the model's layouts.
  EXPECT_FALSE(validate_kv_layout(two_heads).ok());
  EXPECT_TRUE(validate_kv_layout(deepseek_layout()).ok());
}

TEST(KvStorageLatentDeathTest, RowsOnly) {
  KvStorage s(small_layout(), KvType::kF16, KvType::kF16, 2);
  std::vector<float> k(48, 1.0f), v(48, 1.0f);
  EXPECT_DEATH(s.write_token(0, BlockId(0), 0, k.data(), v.data()), "latent layout stores no V: v must be nullptr");
  EXPECT_DEATH(s.mutable_v_block(0, BlockId(0)), "no V arena");
  KvStorage separate({.num_layers = 1, .num_kv_heads = 1, .head_dim = 48, .block_size = 4}, KvType::kF16,
                     KvType::kF16, 2);
  EXPECT_DEATH(separate.write_token(0, BlockId(0), 0, k.data(), nullptr), "no V given");
}

}  // namespace
}  // namespace kvlm
