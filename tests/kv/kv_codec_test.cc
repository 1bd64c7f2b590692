#include "kv/kv_codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kv/kv_type.h"

namespace kvlm {
namespace {

TEST(KvType, ParsesNamesCaseInsensitively) {
  EXPECT_EQ(parse_kv_type("f32"), KvType::kF32);
  EXPECT_EQ(parse_kv_type("F16"), KvType::kF16);
  EXPECT_EQ(parse_kv_type("q8_0"), std::nullopt);
  EXPECT_EQ(parse_kv_type(""), std::nullopt);
  EXPECT_EQ(kv_type_name(KvType::kF32), "f32");
  EXPECT_EQ(kv_type_name(KvType::kF16), "f16");
  for (KvType t : {KvType::kF32, KvType::kF16}) EXPECT_EQ(parse_kv_type(kv_type_name(t)), t);
}

TEST(KvCodec, BlockBytesFollowTheFormula) {
  const KvLayout layout{.num_layers = 3, .num_kv_heads = 4, .head_dim = 8, .block_size = 16};
  EXPECT_EQ(kv_codec(KvType::kF32).block_bytes(layout), 16u * 4 * 8 * 4);
  EXPECT_EQ(kv_codec(KvType::kF16).block_bytes(layout), 16u * 4 * 8 * 2);
  EXPECT_EQ(kv_codec(KvType::kF32).type(), KvType::kF32);
  EXPECT_EQ(kv_codec(KvType::kF16).type(), KvType::kF16);
}

class PlainCodecTest : public ::testing::TestWithParam<KvType> {};

// Each slot is encoded where plain_row_index says, decodes to the value (f32) or
// its f16 rounding, and writing one slot leaves every other byte of the block alone.
TEST_P(PlainCodecTest, RoundTripsEverySlotInPlace) {
  const KvCodec& codec = kv_codec(GetParam());
  const KvLayout layout{.num_layers = 1, .num_kv_heads = 3, .head_dim = 5, .block_size = 4};
  const size_t width = layout.values_per_token();
  std::vector<std::byte> block(codec.block_bytes(layout), std::byte{0});
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  std::vector<std::vector<float>> tokens(static_cast<size_t>(layout.block_size), std::vector<float>(width));
  for (int slot = 0; slot < layout.block_size; ++slot) {
    for (float& x : tokens[static_cast<size_t>(slot)]) x = dist(rng);
    const std::vector<std::byte> before = block;
    codec.encode_token(layout, tokens[static_cast<size_t>(slot)].data(), block.data(), slot);
    // Only the slot's rows changed.
    const size_t elem = GetParam() == KvType::kF32 ? 4 : 2;
    for (size_t i = 0; i < block.size(); ++i) {
      const size_t e = i / elem;
      const size_t row_start = e / layout.head_dim * layout.head_dim;
      bool in_slot = false;
      for (int h = 0; h < layout.num_kv_heads; ++h) in_slot |= row_start == plain_row_index(layout, h, slot);
      if (!in_slot) {
        ASSERT_EQ(block[i], before[i]) << "byte " << i << " changed by slot " << slot;
      }
    }
  }
  for (int slot = 0; slot < layout.block_size; ++slot) {
    std::vector<float> decoded(width);
    codec.decode_token(layout, block.data(), slot, decoded.data());
    for (size_t i = 0; i < width; ++i) {
      const float x = tokens[static_cast<size_t>(slot)][i];
      const float expected = GetParam() == KvType::kF32 ? x : fp16_to_fp32(fp32_to_fp16(x));
      EXPECT_EQ(decoded[i], expected) << "slot " << slot << " value " << i;
    }
    // The stored element sits at plain_row_index.
    const size_t idx = plain_row_index(layout, 2, slot) + 3;
    const float stored = GetParam() == KvType::kF32 ? reinterpret_cast<const float*>(block.data())[idx]
                                                    : fp16_to_fp32(reinterpret_cast<const uint16_t*>(block.data())[idx]);
    EXPECT_EQ(stored, decoded[2 * layout.head_dim + 3]);
  }
}

INSTANTIATE_TEST_SUITE_P(Types, PlainCodecTest, ::testing::Values(KvType::kF32, KvType::kF16),
                         [](const auto& info) { return std::string(kv_type_name(info.param)); });

}  // namespace
}  // namespace kvlm
