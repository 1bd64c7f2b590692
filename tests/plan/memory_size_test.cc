// Memory size parsing and printing, and weight bytes per GGML type.
#include "plan/memory_size.h"

#include <gtest/gtest.h>

namespace kvlm {
namespace {

TEST(MemorySize, ParsesUnits) {
  struct Case {
    const char* text;
    uint64_t bytes;
  };
  const Case cases[] = {
      {"24GiB", 25769803776ull}, {"24GB", 24000000000ull}, {"512MiB", 536870912ull}, {"1.5GiB", 1610612736ull},
      {"123", 123},              {"24 gib", 25769803776ull}, {"2g", 2147483648ull},  {"1TiB", 1099511627776ull},
      {"100kb", 100000},         {"8KiB", 8192},           {"0", 0},                 {"7B", 7},
  };
  for (const Case& c : cases) {
    auto r = parse_memory_size(c.text);
    ASSERT_TRUE(r.ok()) << c.text << ": " << r.status().message();
    EXPECT_EQ(*r, c.bytes) << c.text;
  }
}

TEST(MemorySize, BadInputsNameTheProblem) {
  struct Case {
    const char* text;
    const char* says;
  };
  const Case cases[] = {
      {"", "no number"},          {"GiB", "no number"},        {"-5GiB", "negative"},
      {"24XB", "unknown unit"},   {"1.5", "whole"},            {"99999999TiB", "too large"},
      {"1.2.3GB", "unknown unit"}, {"24GiB extra", "unknown unit"},
  };
  for (const Case& c : cases) {
    auto r = parse_memory_size(c.text);
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_NE(r.status().message().find(c.says), std::string::npos) << c.text << ": " << r.status().message();
    EXPECT_NE(r.status().message().find(std::string("'") + c.text + "'"), std::string::npos) << r.status().message();
  }
}

TEST(MemorySize, FormatsBinaryUnits) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(524288), "512.00 KiB");
  EXPECT_EQ(format_bytes(2097152000.0), "1.95 GiB");
}

// ggml block sizes: q8_0 stores 32 values in 34 bytes, q4_0 in 18.
TEST(MemorySize, WeightBytesPerType) {
  EXPECT_EQ(*weight_bytes_for(6.74e9, GgmlType::kF16), 13480000000ull);
  EXPECT_EQ(*weight_bytes_for(6.74e9, GgmlType::kBF16), 13480000000ull);
  EXPECT_EQ(*weight_bytes_for(6.74e9, GgmlType::kF32), 26960000000ull);
  EXPECT_EQ(*weight_bytes_for(6.74e9, GgmlType::kQ8_0), 210625000ull * 34);
  EXPECT_EQ(*weight_bytes_for(6.74e9, GgmlType::kQ4_0), 210625000ull * 18);
  EXPECT_EQ(*weight_bytes_for(33, GgmlType::kQ4_0), 36u);  // a partial block is a whole block
}

}  // namespace
}  // namespace kvlm
