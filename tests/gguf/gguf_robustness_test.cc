// Malformed GGUF bytes: every one is an error that names the field and the problem, never a crash.
#include <cstring>
#include <random>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gguf/gguf_file.h"
#include "gguf/gguf_parser.h"
#include "gguf/gguf_test_util.h"
#include "gguf/gguf_writer.h"

namespace kvlm {
namespace {

using ::kvlm::testing::parse_error;
using ::kvlm::testing::RawGguf;
using ::testing::HasSubstr;

constexpr uint32_t kF32 = 0;
constexpr uint32_t kQ8_0 = 8;

// One f32 tensor of `num_floats` with its data, after `kvs` (already-encoded key-values).
std::vector<uint8_t> one_tensor_file(uint64_t num_floats, uint64_t offset = 0) {
  RawGguf g;
  g.header(1, 0).tensor_info("w", {num_floats}, kF32, offset).pad_to(32).zeros(offset + num_floats * 4);
  return g.bytes();
}

TEST(GgufMalformed, EmptyInput) { EXPECT_EQ(parse_error({}), "x.gguf: file is empty (0 bytes)"); }

TEST(GgufMalformed, BadMagic) {
  RawGguf g;
  g.raw("GGML").u32(3).u64(0).u64(0);
  EXPECT_EQ(parse_error(g.bytes()),
            "x.gguf: header: magic: bytes 47 47 4d 4c are not 'GGUF' (47 47 55 46), not a GGUF file");
  EXPECT_THAT(parse_error({'G', 'G'}), HasSubstr("x.gguf: header: magic: truncated: needs 4 bytes at offset 0"));
}

TEST(GgufMalformed, UnsupportedVersions) {
  EXPECT_THAT(parse_error(RawGguf().header(0, 0, 1).bytes()),
              HasSubstr("x.gguf: header: version: GGUF version 1 is not supported"));
  EXPECT_EQ(parse_error(RawGguf().header(0, 0, 99).bytes()),
            "x.gguf: header: version: 99 is not supported (kvlm reads GGUF versions 2 and 3)");
  EXPECT_THAT(parse_error(RawGguf().header(0, 0, 0x03000000).bytes()), HasSubstr("big-endian"));
  EXPECT_EQ(parse_error(RawGguf().header(0, 0, 2).bytes()), "OK");  // v2 has the v3 layout
  EXPECT_EQ(parse_error(RawGguf().header(0, 0, 3).bytes()), "OK");
}

TEST(GgufMalformed, AbsurdCountsAreRejectedBeforeAllocating) {
  EXPECT_EQ(parse_error(RawGguf().header(1ull << 40, 0).bytes()),
            "x.gguf: header: tensor_count: 1099511627776 tensor infos cannot fit in the 0 bytes left (each takes "
            "at least 32)");
  EXPECT_THAT(parse_error(RawGguf().header(0, ~0ull).zeros(100).bytes()),
              HasSubstr("x.gguf: header: metadata_kv_count: 18446744073709551615 key-value pairs cannot fit in the "
                        "100 bytes left"));
  EXPECT_THAT(parse_error(RawGguf().header(3, 3).zeros(100).bytes()),
              HasSubstr("header: metadata_kv_count 3 and tensor_count 3 cannot both fit in the 100 bytes left"));
}

TEST(GgufMalformed, AbsurdStringLengths) {
  RawGguf key;
  key.header(0, 1).u64(1ull << 62).zeros(20);
  EXPECT_THAT(parse_error(key.bytes()),
              HasSubstr("x.gguf: metadata key #0: string length 4611686018427387904 at offset 24 exceeds the 20 "
                        "bytes left"));
  RawGguf value;
  value.header(0, 1).str("general.name").u32(8).u64(~0ull).zeros(4);
  EXPECT_THAT(parse_error(value.bytes()),
              HasSubstr("x.gguf: metadata key 'general.name': string length 18446744073709551615"));
  RawGguf name;
  name.header(1, 0).u64(1ull << 50).zeros(40);
  EXPECT_THAT(parse_error(name.bytes()), HasSubstr("x.gguf: tensor 0 name: string length 1125899906842624"));
}

TEST(GgufMalformed, AbsurdArrayCounts) {
  RawGguf g;
  g.header(0, 1).str("tokenizer.ggml.tokens").u32(9).u32(8).u64(1ull << 60).zeros(64);
  EXPECT_EQ(parse_error(g.bytes()),
            "x.gguf: metadata key 'tokenizer.ggml.tokens': array count 1152921504606846976 of string elements "
            "cannot fit in the 64 bytes left (each takes at least 8)");
  // An element deep inside an array names its index.
  RawGguf inner;
  inner.header(0, 1).str("k").u32(9).u32(8).u64(2).str("ok").u64(1ull << 40);
  EXPECT_THAT(parse_error(inner.bytes()), HasSubstr("x.gguf: metadata key 'k': element 1: string length 1099511627776"));
}

TEST(GgufMalformed, TooManyMetadataValuesInTotal) {
  const uint64_t count = GgufParser::kMaxMetadataValues;  // plus the key-value itself: one too many
  RawGguf g;
  g.header(0, 1).str("big").u32(9).u32(0).u64(count).zeros(count);
  EXPECT_THAT(parse_error(g.bytes()), HasSubstr("x.gguf: metadata key 'big': metadata would hold more than 4194304"));
}

TEST(GgufMalformed, UnknownValueTypes) {
  EXPECT_EQ(parse_error(RawGguf().header(0, 1).str("a.b").u32(13).u32(0).bytes()),
            "x.gguf: metadata key 'a.b': unknown value type 13");
  EXPECT_EQ(parse_error(RawGguf().header(0, 1).str("a.b").u32(9).u32(0xffffffff).u64(0).bytes()),
            "x.gguf: metadata key 'a.b': unknown array element type 4294967295");
  EXPECT_EQ(parse_error(RawGguf().header(0, 1).str("flag").u32(7).u8(2).bytes()),
            "x.gguf: metadata key 'flag': bool value 2 is neither 0 nor 1");
}

RawGguf nested_arrays(int levels) {
  RawGguf g;
  g.header(0, 1).str("deep").u32(9);
  for (int i = 0; i < levels; ++i) g.u32(i + 1 < levels ? 9 : 4).u64(i + 1 < levels ? 1 : 0);
  return g;
}

TEST(GgufMalformed, ArrayNestingDepthIsBounded) {
  EXPECT_EQ(parse_error(nested_arrays(GgufParser::kMaxArrayDepth).bytes()), "OK");
  EXPECT_THAT(parse_error(nested_arrays(GgufParser::kMaxArrayDepth + 1).bytes()),
              HasSubstr("metadata key 'deep': element 0: element 0: element 0: element 0: element 0: element 0: "
                        "element 0: element 0: arrays are nested more than 8 levels deep"));
  // A long claimed nesting in a short file fails on counts, not on stack depth.
  EXPECT_NE(parse_error(nested_arrays(100000).bytes()), "OK");
}

TEST(GgufMalformed, DuplicateAndEmptyKeys) {
  EXPECT_EQ(parse_error(RawGguf().header(0, 3).kv_u32("a", 1).kv_u32("b", 2).kv_u32("a", 3).bytes()),
            "x.gguf: metadata key 'a': duplicate key (metadata keys #0 and #2)");
  EXPECT_EQ(parse_error(RawGguf().header(0, 1).kv_u32("", 1).bytes()), "x.gguf: metadata key #0: the key is empty");
}

TEST(GgufMalformed, BadAlignment) {
  EXPECT_EQ(parse_error(RawGguf().header(0, 1).kv_u32("general.alignment", 48).bytes()),
            "x.gguf: metadata key 'general.alignment': alignment 48 is not a power of two between 1 and 1073741824");
  EXPECT_THAT(parse_error(RawGguf().header(0, 1).kv_u32("general.alignment", 0).bytes()),
              HasSubstr("alignment 0 is not a power of two"));
  EXPECT_EQ(parse_error(RawGguf().header(0, 1).kv_string("general.alignment", "64").bytes()),
            "x.gguf: metadata key 'general.alignment': has type string, expected an integer (uint32)");
}

TEST(GgufMalformed, TensorDimsAndTypes) {
  auto with_info = [](const std::vector<uint64_t>& dims, uint32_t type) {
    return parse_error(RawGguf().header(1, 0).tensor_info("blk.0.attn_q.weight", dims, type, 0).zeros(256).bytes());
  };
  EXPECT_EQ(with_info({}, kF32), "x.gguf: tensor 0 'blk.0.attn_q.weight' n_dims: 0 is outside 1..8");
  EXPECT_EQ(with_info({1, 1, 1, 1, 1, 1, 1, 1, 1}, kF32),
            "x.gguf: tensor 0 'blk.0.attn_q.weight' n_dims: 9 is outside 1..8");
  EXPECT_EQ(with_info({4, 0}, kF32),
            "x.gguf: tensor 0 'blk.0.attn_q.weight' dims[1]: 0 (every dimension must be at least 1)");
  EXPECT_EQ(with_info({1ull << 63}, kF32),
            "x.gguf: tensor 0 'blk.0.attn_q.weight' dims[0]: 9223372036854775808 does not fit in int64");
  EXPECT_EQ(with_info({1ull << 32, 1ull << 32}, kF32),
            "x.gguf: tensor 0 'blk.0.attn_q.weight' dims: the element count of 4294967296 x 4294967296 overflows 64 "
            "bits");
  EXPECT_EQ(with_info({1ull << 31, 1ull << 31}, kF32),
            "x.gguf: tensor 0 'blk.0.attn_q.weight' dims: the byte size of 2147483648 x 2147483648 f32 overflows 64 "
            "bits");
  EXPECT_EQ(with_info({4}, 99), "x.gguf: tensor 0 'blk.0.attn_q.weight' type: unknown ggml type 99");
  EXPECT_EQ(with_info({4}, 4), "x.gguf: tensor 0 'blk.0.attn_q.weight' type: unknown ggml type 4");  // removed q4_2
  EXPECT_EQ(with_info({33}, kQ8_0),
            "x.gguf: tensor 0 'blk.0.attn_q.weight' dims[0]: 33 is not a multiple of the q8_0 block size 32");
  // An absurd n_dims is refused before any dim is read.
  EXPECT_THAT(parse_error(RawGguf().header(1, 0).str("w").u32(0x80000000).zeros(64).bytes()),
              HasSubstr("tensor 0 'w' n_dims: 2147483648 is outside 1..8"));
}

TEST(GgufMalformed, TensorOffsets) {
  EXPECT_EQ(parse_error(one_tensor_file(8, 0)), "OK");
  EXPECT_EQ(parse_error(RawGguf().header(1, 0).tensor_info("w", {8}, kF32, 100).pad_to(32).zeros(160).bytes()),
            "x.gguf: tensor 0 'w' offset: 100 is not a multiple of the alignment 32");
  EXPECT_EQ(parse_error(RawGguf().header(1, 0).tensor_info("w", {8}, kF32, 1ull << 40).pad_to(32).zeros(64).bytes()),
            "x.gguf: tensor 0 'w' offset: 1099511627776 points past the end of the file (128 bytes; the data "
            "section starts at 64)");
  // Infos end at 24 + 8+17 + 4 + 8 + 4 + 8 = 73, so data starts at 96; 4096 bytes of f32 do not fit in 128.
  EXPECT_EQ(parse_error(RawGguf().header(1, 0).tensor_info("token_embd.weight", {1024}, kF32, 0).pad_to(32).zeros(32).bytes()),
            "x.gguf: tensor 0 'token_embd.weight': data [96, 4192) extends past the end of the file (128 bytes)");
  // Tensor infos that end at the end of the file leave no room for a data section.
  EXPECT_EQ(parse_error(RawGguf().header(1, 0).tensor_info("w", {8}, kF32, 0).bytes()),
            "x.gguf: data section: starts at offset 64 (tensor infos end at 57, aligned to 32) but the file has only "
            "57 bytes");
}

TEST(GgufMalformed, OverlappingAndDuplicateTensors) {
  RawGguf overlap;
  overlap.header(2, 0).tensor_info("a", {16}, kF32, 0).tensor_info("b", {8}, kF32, 32).pad_to(32).zeros(128);
  EXPECT_EQ(parse_error(overlap.bytes()),
            "x.gguf: tensor 1 'b': data [128, 160) overlaps tensor 0 'a' at [96, 160)");
  RawGguf same;
  same.header(2, 0).tensor_info("a", {8}, kF32, 32).tensor_info("b", {8}, kF32, 32).pad_to(32).zeros(128);
  EXPECT_THAT(parse_error(same.bytes()), HasSubstr("tensor 1 'b': data [128, 160) overlaps tensor 0 'a'"));
  RawGguf adjacent;
  adjacent.header(2, 0).tensor_info("a", {8}, kF32, 32).tensor_info("b", {8}, kF32, 0).pad_to(32).zeros(128);
  EXPECT_EQ(parse_error(adjacent.bytes()), "OK");

  RawGguf dup;
  dup.header(2, 0).tensor_info("a", {8}, kF32, 0).tensor_info("a", {8}, kF32, 32).pad_to(32).zeros(64);
  EXPECT_EQ(parse_error(dup.bytes()), "x.gguf: tensor 1 'a': duplicate tensor name (tensors 0 and 1)");
  EXPECT_EQ(parse_error(RawGguf().header(1, 0).tensor_info("", {8}, kF32, 0).pad_to(32).zeros(32).bytes()),
            "x.gguf: tensor 0 name: the name is empty");
}

TEST(GgufMalformed, NamesInMessagesAreEscapedAndShortened) {
  EXPECT_EQ(parse_error(RawGguf().header(0, 1).str("bad\nkey'").u32(13).bytes()),
            "x.gguf: metadata key 'bad\\x0akey\\x27': unknown value type 13");
  const std::string long_key(1000, 'k');
  EXPECT_THAT(parse_error(RawGguf().header(0, 1).str(long_key).u32(13).bytes()),
              HasSubstr("kkk...' (1000 bytes): unknown value type 13"));
}

// A small valid file with a bit of everything: alignment key, arrays, three tensor types.
std::vector<uint8_t> small_valid_file() {
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_alignment(64);
  w.set_u32("llama.block_count", 2);
  w.set("tokenizer.ggml.tokens", GgufValue::string_array({"<unk>", "<s>", "</s>", "a"}));
  w.set("tokenizer.ggml.scores", GgufValue::f32_array({0.0f, -1.0f, -2.0f, -3.5f}));
  w.set("nested", GgufValue::make_array(GgufType::kArray, {GgufValue::i32_array({1, 2})}));
  w.add_tensor_f32("token_embd.weight", GgmlType::kF32, {4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  std::vector<float> v(64, 0.5f);
  w.add_tensor_f32("blk.0.attn_q.weight", GgmlType::kQ8_0, {32, 2}, v);
  w.add_tensor_f32("output_norm.weight", GgmlType::kF16, {3}, {1, 2, 3});
  return w.to_bytes();
}

TEST(GgufMalformed, EveryTruncationIsAnError) {
  const std::vector<uint8_t> bytes = small_valid_file();
  auto whole = GgufFile::from_bytes(bytes, "x.gguf");
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  uint64_t data_end = 0;  // the file is valid from here on: what follows is the last tensor's padding
  for (const GgufTensorInfo& t : whole.value()->tensors()) {
    data_end = std::max(data_end, whole.value()->data_offset() + t.offset + t.num_bytes);
  }
  ASSERT_LT(data_end, bytes.size());
  int num_errors = 0;
  for (size_t length = 0; length < bytes.size(); ++length) {
    const std::string error = parse_error(std::vector<uint8_t>(bytes.begin(), bytes.begin() + length));
    if (length < data_end) {
      ASSERT_NE(error, "OK") << "prefix of " << length << " bytes";
      ASSERT_EQ(error.rfind("x.gguf: ", 0), 0u) << error;
      const bool named = error.find("truncated") != std::string::npos ||
                         error.find("cannot fit") != std::string::npos ||
                         error.find("bytes left") != std::string::npos ||
                         error.find("past the end of the file") != std::string::npos ||
                         error.find("data section") != std::string::npos ||
                         error.find("file is empty") != std::string::npos;
      ASSERT_TRUE(named) << "prefix of " << length << " bytes: " << error;
      ++num_errors;
    } else {
      ASSERT_EQ(error, "OK") << "prefix of " << length << " bytes";
    }
  }
  EXPECT_EQ(num_errors, static_cast<int>(data_end));
}

// Random mutations of a valid file: parsing must return (OK or an error), and when it says OK,
// every tensor it hands out must lie inside the bytes (AddressSanitizer checks the reads).
TEST(GgufMalformed, RandomMutationsNeverCrash) {
  const std::vector<uint8_t> original = small_valid_file();
  std::mt19937_64 rng(20240601);
  const uint64_t interesting[] = {0, 1, 2, 7, 8, 9, 13, 31, 32, 0x7f, 0xff, 0xffff, 0xffffffffull, 1ull << 32,
                                  1ull << 62, 1ull << 63, ~0ull, original.size(), original.size() - 1};
  int num_ok = 0;
  constexpr int kIterations = 4000;
  for (int iter = 0; iter < kIterations; ++iter) {
    std::vector<uint8_t> bytes = original;
    const int num_mutations = 1 + static_cast<int>(rng() % 3);
    for (int m = 0; m < num_mutations && !bytes.empty(); ++m) {
      const size_t pos = rng() % bytes.size();
      switch (rng() % 6) {
        case 0:  // flip one bit
          bytes[pos] ^= static_cast<uint8_t>(1u << (rng() % 8));
          break;
        case 1:  // random byte
          bytes[pos] = static_cast<uint8_t>(rng());
          break;
        case 2: {  // an interesting 4- or 8-byte little-endian value
          const uint64_t v = interesting[rng() % std::size(interesting)];
          const size_t width = rng() % 2 == 0 ? 4 : 8;
          for (size_t k = 0; k < width && pos + k < bytes.size(); ++k) bytes[pos + k] = static_cast<uint8_t>(v >> (8 * k));
          break;
        }
        case 3:  // truncate
          bytes.resize(pos);
          break;
        case 4: {  // insert a few bytes
          const size_t n = 1 + rng() % 8;
          bytes.insert(bytes.begin() + static_cast<std::ptrdiff_t>(pos), n, static_cast<uint8_t>(rng()));
          break;
        }
        default: {  // delete a few bytes
          const size_t n = std::min<size_t>(1 + rng() % 8, bytes.size() - pos);
          bytes.erase(bytes.begin() + static_cast<std::ptrdiff_t>(pos),
                      bytes.begin() + static_cast<std::ptrdiff_t>(pos + n));
          break;
        }
      }
    }
    auto file = GgufFile::from_bytes(bytes, "fuzz.gguf");
    if (!file.ok()) {
      ASSERT_EQ(file.status().message().rfind("fuzz.gguf: ", 0), 0u) << file.status().message();
      continue;
    }
    ++num_ok;
    const GgufFile& f = *file.value();
    size_t display_chars = 0;
    for (const GgufKeyValue& kv : f.metadata()) {
      ASSERT_FALSE(kv.key.empty());
      display_chars += kv.value.to_display_string().size();
    }
    uint64_t checksum = display_chars;
    for (const GgufTensorInfo& t : f.tensors()) {
      ASSERT_GE(t.num_elements(), 1);
      ASSERT_LE(f.data_offset() + t.offset + t.num_bytes, f.file_size());
      for (uint64_t k = 0; k < t.num_bytes; ++k) checksum += t.data[k];
    }
    (void)checksum;

    // Whatever the reader accepts, the writer reproduces: same keys, values and tensor bytes.
    GgufWriter w;
    for (const GgufKeyValue& kv : f.metadata()) w.set(kv.key, kv.value);
    for (const GgufTensorInfo& t : f.tensors()) {
      w.add_tensor(t.name, t.type, t.dims, std::vector<uint8_t>(t.data, t.data + t.num_bytes));
    }
    auto again = GgufFile::from_bytes(w.to_bytes(), "rewritten.gguf");
    ASSERT_TRUE(again.ok()) << again.status().message();
    const GgufFile& g = *again.value();
    ASSERT_EQ(g.metadata().size(), f.metadata().size());
    for (size_t k = 0; k < f.metadata().size(); ++k) {
      ASSERT_EQ(g.metadata()[k].key, f.metadata()[k].key);
      ASSERT_EQ(g.metadata()[k].value.type(), f.metadata()[k].value.type());
      ASSERT_EQ(g.metadata()[k].value.to_display_string(1000), f.metadata()[k].value.to_display_string(1000));
    }
    ASSERT_EQ(g.tensors().size(), f.tensors().size());
    for (size_t k = 0; k < f.tensors().size(); ++k) {
      const GgufTensorInfo& a = f.tensors()[k];
      const GgufTensorInfo& b = g.tensors()[k];
      ASSERT_EQ(b.name, a.name);
      ASSERT_EQ(b.type, a.type);
      ASSERT_EQ(b.dims, a.dims);
      ASSERT_EQ(b.num_bytes, a.num_bytes);
      ASSERT_EQ(std::memcmp(a.data, b.data, a.num_bytes), 0);
    }
  }
  // Most mutations must be caught; a few land in padding or tensor data and stay valid.
  EXPECT_GT(num_ok, 0);
  EXPECT_LT(num_ok, kIterations / 2);
}

}  // namespace
}  // namespace kvlm
