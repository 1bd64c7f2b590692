// GgufLimits: each bound refuses one over it with an error naming the field and the limit, and
// accepts a file exactly at it.
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gguf/gguf_limits.h"
#include "gguf/gguf_test_util.h"

namespace kvlm {
namespace {

using ::kvlm::testing::parse_error;
using ::kvlm::testing::RawGguf;
using ::testing::HasSubstr;

TEST(GgufLimits, MetadataKeyValueCount) {
  const uint64_t count = kGgufLimits.max_metadata_kv + 1;
  RawGguf g;
  g.header(0, count).zeros(count * 13);  // enough bytes that the count could fit
  EXPECT_EQ(parse_error(g.bytes()),
            "x.gguf: header: metadata_kv_count: 65537 is over the limit of 65536 (GgufLimits::max_metadata_kv)");
}

TEST(GgufLimits, TensorCount) {
  const uint64_t count = kGgufLimits.max_tensors + 1;
  RawGguf g;
  g.header(count, 0).zeros(count * 32);
  EXPECT_EQ(parse_error(g.bytes()),
            "x.gguf: header: tensor_count: 1048577 is over the limit of 1048576 (GgufLimits::max_tensors)");
}

TEST(GgufLimits, KeyLength) {
  const std::string at_limit(kGgufLimits.max_key_bytes, 'k');
  EXPECT_EQ(parse_error(RawGguf().header(0, 1).kv_u32(at_limit, 1).bytes()), "OK");
  const std::string over(kGgufLimits.max_key_bytes + 1, 'k');
  EXPECT_EQ(parse_error(RawGguf().header(0, 1).kv_u32(over, 1).bytes()),
            "x.gguf: metadata key #0: the key of 65537 bytes is over the limit of 65536 bytes "
            "(GgufLimits::max_key_bytes)");
}

TEST(GgufLimits, TensorNameLength) {
  const std::string over(kGgufLimits.max_key_bytes + 1, 't');
  RawGguf g;
  g.header(1, 0).tensor_info(over, {32}, 0, 0);
  EXPECT_EQ(parse_error(g.bytes()),
            "x.gguf: tensor 0 name: the name of 65537 bytes is over the limit of 65536 bytes "
            "(GgufLimits::max_key_bytes)");
}

TEST(GgufLimits, StringValueLength) {
  const std::string over(kGgufLimits.max_string_bytes + 1, 's');
  EXPECT_THAT(parse_error(RawGguf().header(0, 1).kv_string("tokenizer.chat_template", over).bytes()),
              HasSubstr("x.gguf: metadata key 'tokenizer.chat_template': a string of 67108865 bytes is over the "
                        "limit of 67108864 bytes (GgufLimits::max_string_bytes)"));
  // Inside an array too, with the element's index.
  RawGguf array;
  array.header(0, 1).str("tokenizer.ggml.tokens").u32(9).u32(8).u64(2).str("ok").str(over);
  EXPECT_THAT(parse_error(array.bytes()),
              HasSubstr("metadata key 'tokenizer.ggml.tokens': element 1: a string of 67108865 bytes is over"));
}

}  // namespace
}  // namespace kvlm
