#include "core/dtype.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

namespace kvlm {
namespace {

TEST(Fp16, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = fp16_to_fp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(fp32_to_fp16(f), h) << "half bits " << h;
  }
}

TEST(Fp16, KnownValuesAndRounding) {
  EXPECT_EQ(fp32_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(fp32_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(1e6f), 0x7c00);
  EXPECT_EQ(fp32_to_fp16(5.9604645e-8f), 0x0001);  // smallest subnormal
  // 1 + 2^-11 is halfway between 1 and the next half: ties go to even (1.0).
  EXPECT_EQ(fp32_to_fp16(1.0f + 0.00048828125f), 0x3c00);
  EXPECT_EQ(fp16_to_fp32(0x3555), 0.333251953125f);
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_fp32(0x3f80), 1.0f);
  EXPECT_FLOAT_EQ(bf16_to_fp32(fp32_to_bf16(3.14159f)), 3.140625f);
}

TEST(GgmlTypes, TraitsAndNames) {
  EXPECT_EQ(ggml_type_traits(GgmlType::kQ8_0).block_bytes, 34u);
  EXPECT_EQ(ggml_type_traits(GgmlType::kQ4_0).block_bytes, 18u);
  EXPECT_FALSE(ggml_type_traits(uint32_t{99}).has_value());
  EXPECT_EQ(parse_ggml_type("Q8_0"), GgmlType::kQ8_0);
  EXPECT_EQ(parse_ggml_type("bf16"), GgmlType::kBF16);
  EXPECT_FALSE(parse_ggml_type("q9").has_value());
}

}  // namespace
}  // namespace kvlm
