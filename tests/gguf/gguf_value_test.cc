#include "gguf/gguf_value.h"

#include <cstdint>
#include <limits>

#include <gtest/gtest.h>

namespace kvlm {
namespace {

TEST(GgufValue, IntegersConvertWhereRepresentable) {
  const GgufValue big = GgufValue::make_uint(GgufType::kUint64, std::numeric_limits<uint64_t>::max());
  EXPECT_TRUE(big.is_integer());
  EXPECT_FALSE(big.as_int().has_value());  // above INT64_MAX
  EXPECT_EQ(big.as_uint(), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(big.as_float(), 18446744073709551615.0);

  const GgufValue neg = GgufValue::make_int(GgufType::kInt16, -300);
  EXPECT_EQ(neg.as_int(), -300);
  EXPECT_FALSE(neg.as_uint().has_value());
  EXPECT_EQ(neg.as_float(), -300.0);
  EXPECT_FALSE(neg.as_bool().has_value());
  EXPECT_FALSE(neg.as_string().has_value());

  const GgufValue flag = GgufValue::make_bool(true);
  EXPECT_FALSE(flag.is_integer());
  EXPECT_EQ(flag.as_bool(), true);
  EXPECT_EQ(flag.as_int(), 1);
  EXPECT_FALSE(flag.as_float().has_value());
}

TEST(GgufValue, Float32IsStoredAtFloatPrecision) {
  const GgufValue v = GgufValue::f32(0.1f);
  EXPECT_EQ(v.type(), GgufType::kFloat32);
  EXPECT_EQ(v.as_float(), static_cast<double>(0.1f));
  EXPECT_EQ(GgufValue::make_float(GgufType::kFloat32, 0.1).as_float(), static_cast<double>(0.1f));
  EXPECT_EQ(GgufValue::make_float(GgufType::kFloat64, 0.1).as_float(), 0.1);
  EXPECT_FALSE(v.as_int().has_value());
}

TEST(GgufValue, ArraysKeepElementType) {
  const GgufValue a = GgufValue::i32_array({1, -2, 3});
  EXPECT_EQ(a.type(), GgufType::kArray);
  EXPECT_EQ(a.element_type(), GgufType::kInt32);
  ASSERT_EQ(a.elements().size(), 3u);
  EXPECT_EQ(a.elements()[1].as_int(), -2);
  EXPECT_FALSE(a.as_int().has_value());
  const GgufValue s = GgufValue::string_array({"a", "b"});
  EXPECT_EQ(s.element_type(), GgufType::kString);
  EXPECT_EQ(s.elements()[1].as_string(), "b");
}

TEST(GgufValue, DisplayScalarsPlainly) {
  EXPECT_EQ(GgufValue::u32(42).to_display_string(), "42");
  EXPECT_EQ(GgufValue::i32(-7).to_display_string(), "-7");
  EXPECT_EQ(GgufValue::make_uint(GgufType::kUint64, std::numeric_limits<uint64_t>::max()).to_display_string(),
            "18446744073709551615");
  EXPECT_EQ(GgufValue::make_int(GgufType::kInt64, std::numeric_limits<int64_t>::min()).to_display_string(),
            "-9223372036854775808");
  EXPECT_EQ(GgufValue::f32(1.5f).to_display_string(), "1.5");
  EXPECT_EQ(GgufValue::f32(1e-5f).to_display_string(), "1e-05");  // shortest float32 text, not 9.99999974e-06
  EXPECT_EQ(GgufValue::make_float(GgufType::kFloat64, 0.1).to_display_string(), "0.1");
  EXPECT_EQ(GgufValue::make_bool(false).to_display_string(), "false");
  EXPECT_EQ(GgufValue::make_string("llama").to_display_string(), "llama");
}

TEST(GgufValue, DisplayArraysWithQuotedStringsAndTotal) {
  EXPECT_EQ(GgufValue::i32_array({1, 2, 3}).to_display_string(), "[1, 2, 3]");
  EXPECT_EQ(GgufValue::i32_array({1, 2, 3, 4, 5}).to_display_string(3), "[1, 2, 3, ... (5 total)]");
  EXPECT_EQ(GgufValue::i32_array({}).to_display_string(), "[]");
  EXPECT_EQ(GgufValue::i32_array({9}).to_display_string(0), "[... (1 total)]");
  EXPECT_EQ(GgufValue::string_array({"<s>", "a \"b\"", "\n", std::string("\x01", 1)}).to_display_string(),
            R"(["<s>", "a \"b\"", "\n", "\x01"])");
  const GgufValue nested = GgufValue::make_array(
      GgufType::kArray, {GgufValue::i32_array({1, 2}), GgufValue::i32_array({3})});
  EXPECT_EQ(nested.to_display_string(), "[[1, 2], [3]]");
  const GgufValue nested_strings = GgufValue::make_array(GgufType::kArray, {GgufValue::string_array({"x"})});
  EXPECT_EQ(nested_strings.to_display_string(), R"([["x"]])");
}

TEST(GgufValue, TypeNames) {
  EXPECT_EQ(gguf_type_name(GgufType::kUint8), "uint8");
  EXPECT_EQ(gguf_type_name(GgufType::kArray), "array");
  EXPECT_EQ(gguf_type_name(GgufType::kFloat64), "float64");
  EXPECT_EQ(gguf_type_name(static_cast<GgufType>(77)), "unknown");
}

}  // namespace
}  // namespace kvlm
