// Round trips writer -> reader: every value type, arrays, tensors of every supported type, alignment.
#include "gguf/gguf_writer.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include <gtest/gtest.h>

#include "core/quantize.h"
#include "gguf/gguf_file.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

std::unique_ptr<GgufFile> round_trip(const GgufWriter& writer) {
  auto file = GgufFile::from_bytes(writer.to_bytes(), "roundtrip.gguf");
  EXPECT_TRUE(file.ok()) << file.status().message();
  if (!file.ok()) return nullptr;
  return std::move(file).value();
}

std::vector<uint8_t> read_whole_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(GgufRoundTrip, EveryScalarType) {
  GgufWriter w;
  w.set("u8", GgufValue::make_uint(GgufType::kUint8, 255));
  w.set("i8", GgufValue::make_int(GgufType::kInt8, -128));
  w.set("u16", GgufValue::make_uint(GgufType::kUint16, 65535));
  w.set("i16", GgufValue::make_int(GgufType::kInt16, -32768));
  w.set_u32("u32", std::numeric_limits<uint32_t>::max());
  w.set_i32("i32", std::numeric_limits<int32_t>::min());
  w.set_f32("f32", 1e-5f);
  w.set_bool("bool_true", true);
  w.set_bool("bool_false", false);
  w.set_string("string", std::string("h\0\xc3\xa9llo", 7));
  w.set_string("empty_string", "");
  w.set("u64", GgufValue::make_uint(GgufType::kUint64, std::numeric_limits<uint64_t>::max()));
  w.set("i64", GgufValue::make_int(GgufType::kInt64, std::numeric_limits<int64_t>::min()));
  w.set("f64", GgufValue::make_float(GgufType::kFloat64, M_PI));
  auto f = round_trip(w);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_TRUE(f->tensors().empty());
  ASSERT_EQ(f->metadata().size(), 14u);

  auto expect = [&](const char* key, GgufType type) {
    const GgufValue* v = f->find(key);
    EXPECT_NE(v, nullptr) << key;
    if (v != nullptr) {
      EXPECT_EQ(v->type(), type) << key;
    }
    return v;
  };
  EXPECT_EQ(expect("u8", GgufType::kUint8)->as_int(), 255);
  EXPECT_EQ(expect("i8", GgufType::kInt8)->as_int(), -128);
  EXPECT_EQ(expect("u16", GgufType::kUint16)->as_int(), 65535);
  EXPECT_EQ(expect("i16", GgufType::kInt16)->as_int(), -32768);
  EXPECT_EQ(expect("u32", GgufType::kUint32)->as_int(), 4294967295);
  EXPECT_EQ(expect("i32", GgufType::kInt32)->as_int(), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(expect("f32", GgufType::kFloat32)->as_float(), static_cast<double>(1e-5f));
  EXPECT_EQ(expect("bool_true", GgufType::kBool)->as_bool(), true);
  EXPECT_EQ(expect("bool_false", GgufType::kBool)->as_bool(), false);
  EXPECT_EQ(expect("string", GgufType::kString)->as_string(), std::string_view("h\0\xc3\xa9llo", 7));
  EXPECT_EQ(expect("empty_string", GgufType::kString)->as_string(), "");
  EXPECT_EQ(expect("u64", GgufType::kUint64)->as_uint(), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(expect("i64", GgufType::kInt64)->as_int(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(expect("f64", GgufType::kFloat64)->as_float(), M_PI);
  EXPECT_EQ(f->find("absent"), nullptr);
}

TEST(GgufRoundTrip, ArraysOfEveryTypeAndNested) {
  GgufWriter w;
  w.set("u8s", GgufValue::make_array(GgufType::kUint8, {GgufValue::make_uint(GgufType::kUint8, 0),
                                                         GgufValue::make_uint(GgufType::kUint8, 200)}));
  w.set("i16s", GgufValue::make_array(GgufType::kInt16, {GgufValue::make_int(GgufType::kInt16, -5)}));
  w.set("u64s", GgufValue::make_array(GgufType::kUint64, {GgufValue::make_uint(GgufType::kUint64, 1ull << 63)}));
  w.set("i64s", GgufValue::make_array(GgufType::kInt64, {GgufValue::make_int(GgufType::kInt64, -(1ll << 40))}));
  w.set("f64s", GgufValue::make_array(GgufType::kFloat64, {GgufValue::make_float(GgufType::kFloat64, -2.25)}));
  w.set("bools", GgufValue::make_array(GgufType::kBool, {GgufValue::make_bool(true), GgufValue::make_bool(false)}));
  w.set("i32s", GgufValue::i32_array({1, -2, 3}));
  w.set("f32s", GgufValue::f32_array({0.5f, -1.25f}));
  w.set("strings", GgufValue::string_array({"<unk>", "", "\xe2\x96\x81the", std::string("a\0b", 3)}));
  w.set("empty", GgufValue::i32_array({}));
  w.set("nested", GgufValue::make_array(
                      GgufType::kArray, {GgufValue::string_array({"x", "y"}), GgufValue::f32_array({1.0f}),
                                         GgufValue::make_array(GgufType::kArray, {GgufValue::i32_array({7})})}));
  auto f = round_trip(w);
  ASSERT_NE(f, nullptr);

  EXPECT_EQ(f->find("u8s")->to_display_string(), "[0, 200]");
  EXPECT_EQ(f->find("u8s")->element_type(), GgufType::kUint8);
  EXPECT_EQ(f->find("i16s")->to_display_string(), "[-5]");
  EXPECT_EQ(f->find("u64s")->elements()[0].as_uint(), 1ull << 63);
  EXPECT_EQ(f->find("i64s")->elements()[0].as_int(), -(1ll << 40));
  EXPECT_EQ(f->find("f64s")->elements()[0].as_float(), -2.25);
  EXPECT_EQ(f->find("bools")->to_display_string(), "[true, false]");
  EXPECT_EQ(f->get_int_array("i32s").value(), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(f->get_float_array("f32s").value(), (std::vector<float>{0.5f, -1.25f}));
  EXPECT_EQ(f->get_string_array("strings").value(),
            (std::vector<std::string>{"<unk>", "", "\xe2\x96\x81the", std::string("a\0b", 3)}));
  EXPECT_TRUE(f->get_int_array("empty").value().empty());
  const GgufValue* nested = f->find("nested");
  ASSERT_NE(nested, nullptr);
  EXPECT_EQ(nested->element_type(), GgufType::kArray);
  EXPECT_EQ(nested->to_display_string(), R"([["x", "y"], [1], [[7]]])");
  EXPECT_EQ(nested->elements()[1].element_type(), GgufType::kFloat32);
}

TEST(GgufRoundTrip, MetadataKeepsInsertionOrderAndSetReplacesInPlace) {
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_u32("b", 1);
  w.set_u32("a", 2);
  w.set_string("general.architecture", "qwen2");  // replaced where it was
  auto f = round_trip(w);
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(f->metadata().size(), 3u);
  EXPECT_EQ(f->metadata()[0].key, "general.architecture");
  EXPECT_EQ(f->metadata()[0].value.as_string(), "qwen2");
  EXPECT_EQ(f->metadata()[1].key, "b");
  EXPECT_EQ(f->metadata()[2].key, "a");
}

TEST(GgufRoundTrip, TypedGettersAndTheirErrors) {
  GgufWriter w;
  w.set_string("s", "text");
  w.set_u32("n", 7);
  w.set("big", GgufValue::make_uint(GgufType::kUint64, std::numeric_limits<uint64_t>::max()));
  w.set_f32("x", 0.25f);
  w.set_bool("flag", true);
  w.set("ints", GgufValue::i32_array({4, 5}));
  w.set("strs", GgufValue::string_array({"a"}));
  auto f = round_trip(w);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->get_string("s").value(), "text");
  EXPECT_EQ(f->get_int("n").value(), 7);
  EXPECT_EQ(f->get_float("n").value(), 7.0);  // integers are accepted where a float is asked for
  EXPECT_EQ(f->get_float("x").value(), 0.25);
  EXPECT_EQ(f->get_bool("flag").value(), true);
  EXPECT_EQ(f->get_float_array("ints").value(), (std::vector<float>{4.0f, 5.0f}));

  EXPECT_EQ(f->get_string("missing").status().message(), "roundtrip.gguf: metadata key 'missing' is missing");
  EXPECT_EQ(f->get_int("s").status().message(),
            "roundtrip.gguf: metadata key 's' has type string, expected an integer");
  EXPECT_NE(f->get_int("big").status().message().find("does not fit in int64"), std::string::npos);
  EXPECT_NE(f->get_int("x").status().message().find("has type float32"), std::string::npos);
  EXPECT_NE(f->get_string("n").status().message().find("expected string"), std::string::npos);
  EXPECT_NE(f->get_bool("n").status().message().find("expected bool"), std::string::npos);
  EXPECT_NE(f->get_float("s").status().message().find("expected a float"), std::string::npos);
  EXPECT_NE(f->get_string_array("ints").status().message().find("has type array of int32, expected array of string"),
            std::string::npos);
  EXPECT_NE(f->get_int_array("strs").status().message().find("expected array of integer"), std::string::npos);
  EXPECT_NE(f->get_float_array("s").status().message().find("has type string"), std::string::npos);
}

// Tensors of every type kvlm computes with (converted from f32) plus raw types it only carries.
class GgufTensorRoundTrip : public ::testing::TestWithParam<uint32_t> {};

TEST_P(GgufTensorRoundTrip, TensorsOfEachTypeKeepDimsBytesAndAlignment) {
  const uint32_t alignment = GetParam();
  struct Case {
    std::string name;
    GgmlType type;
    std::vector<int64_t> dims;
    float tolerance;  // max |dequantized - original| relative to the max |original| of the tensor
  };
  const std::vector<Case> cases = {
      {"f32", GgmlType::kF32, {7, 3}, 0.0f},
      {"f16", GgmlType::kF16, {5}, 1e-3f},
      {"bf16", GgmlType::kBF16, {3, 2, 2}, 8e-3f},
      {"q8_0", GgmlType::kQ8_0, {64, 3}, 1.0f / 127.0f},
      {"q4_0", GgmlType::kQ4_0, {32, 2, 1, 2}, 1.0f / 8.0f},
  };
  GgufWriter w;
  w.set_alignment(alignment);
  w.set_string("general.architecture", "test");
  std::vector<std::vector<float>> originals;
  for (size_t i = 0; i < cases.size(); ++i) {
    size_t n = 1;
    for (const int64_t d : cases[i].dims) n *= static_cast<size_t>(d);
    originals.push_back(random_values(n, 100 + static_cast<uint32_t>(i)));
    w.add_tensor_f32(cases[i].name, cases[i].type, cases[i].dims, originals.back());
  }
  // Raw bytes of types kvlm cannot compute with are carried unchanged.
  std::vector<uint8_t> q4k(2 * 144);
  for (size_t i = 0; i < q4k.size(); ++i) q4k[i] = static_cast<uint8_t>(i * 7 + 3);
  w.add_tensor("q4_k", GgmlType::kQ4_K, {256, 2}, q4k);
  w.add_tensor("i32", GgmlType::kI32, {3}, std::vector<uint8_t>(12, 0xab));
  int filler_calls = 0;
  w.add_tensor("q6_k_filled", GgmlType::kQ6_K, {512}, [&](uint8_t* dst, uint64_t n) {
    ++filler_calls;
    EXPECT_EQ(n, 2u * 210u);
    for (uint64_t i = 0; i < n; ++i) dst[i] = static_cast<uint8_t>(255 - i % 251);
  });
  EXPECT_EQ(filler_calls, 0);  // nothing is produced before the file is written

  const std::vector<uint8_t> bytes = w.to_bytes();
  EXPECT_EQ(filler_calls, 1);
  EXPECT_EQ(bytes.size() % alignment, 0u);
  auto parsed = GgufFile::from_bytes(bytes, "t.gguf");
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  const GgufFile& f = *parsed.value();
  EXPECT_EQ(f.alignment(), alignment);
  EXPECT_EQ(f.data_offset() % alignment, 0u);
  if (alignment == 32) {
    EXPECT_EQ(f.find("general.alignment"), nullptr);
  } else {
    ASSERT_NE(f.find("general.alignment"), nullptr);
    EXPECT_EQ(f.find("general.alignment")->type(), GgufType::kUint32);
    EXPECT_EQ(f.get_int("general.alignment").value(), alignment);
  }
  ASSERT_EQ(f.tensors().size(), cases.size() + 3);

  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].name);
    const GgufTensorInfo* t = f.find_tensor(cases[i].name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t, &f.tensors()[i]);  // file order is insertion order
    EXPECT_EQ(t->type, cases[i].type);
    EXPECT_EQ(t->dims, cases[i].dims);
    EXPECT_EQ(t->num_elements(), static_cast<int64_t>(originals[i].size()));
    EXPECT_EQ(t->num_bytes, ggml_row_bytes(cases[i].type, cases[i].dims[0]) *
                                (originals[i].size() / static_cast<size_t>(cases[i].dims[0])));
    EXPECT_EQ(t->offset % alignment, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % alignment, 0u);  // from_bytes keeps the alignment too
    ASSERT_EQ(t->data, f.tensors()[0].data - f.tensors()[0].offset + t->offset);
    // Bytes equal the reference quantizer applied row by row.
    const int64_t row = cases[i].dims[0];
    const uint64_t row_bytes = ggml_row_bytes(cases[i].type, row);
    std::vector<uint8_t> expected(t->num_bytes);
    for (size_t r = 0; r * row < originals[i].size(); ++r) {
      quantize_row_reference(cases[i].type, originals[i].data() + r * row, expected.data() + r * row_bytes, row);
    }
    EXPECT_EQ(std::memcmp(t->data, expected.data(), expected.size()), 0);
    // And decode back close to the originals.
    std::vector<float> decoded(originals[i].size());
    for (size_t r = 0; r * row < originals[i].size(); ++r) {
      dequantize_row_reference(cases[i].type, t->data + r * row_bytes, decoded.data() + r * row, row);
    }
    float amax = 0.0f;
    for (const float x : originals[i]) amax = std::max(amax, std::fabs(x));
    for (size_t k = 0; k < decoded.size(); ++k) {
      ASSERT_LE(std::fabs(decoded[k] - originals[i][k]), cases[i].tolerance * amax) << "element " << k;
    }
  }
  const GgufTensorInfo* raw = f.find_tensor("q4_k");
  ASSERT_NE(raw, nullptr);
  EXPECT_EQ(raw->num_bytes, q4k.size());
  EXPECT_EQ(std::memcmp(raw->data, q4k.data(), q4k.size()), 0);
  const GgufTensorInfo* filled = f.find_tensor("q6_k_filled");
  ASSERT_NE(filled, nullptr);
  EXPECT_EQ(filled->data[0], 255);
  EXPECT_EQ(filled->data[419], static_cast<uint8_t>(255 - 419 % 251));
  EXPECT_EQ(f.find_tensor("absent"), nullptr);

  // Padding after each tensor is zero.
  for (const GgufTensorInfo& t : f.tensors()) {
    const uint64_t end = f.data_offset() + t.offset + t.num_bytes;
    const uint64_t padded = (end + alignment - 1) / alignment * alignment;
    for (uint64_t k = end; k < padded; ++k) ASSERT_EQ(bytes[k], 0) << t.name << " padding byte " << k;
  }
}

INSTANTIATE_TEST_SUITE_P(Alignments, GgufTensorRoundTrip, ::testing::Values(32u, 64u, 1u, 4096u));

TEST(GgufRoundTrip, AlignmentSetThroughMetadataKeyAppliesToo) {
  GgufWriter w;
  w.set("general.alignment", GgufValue::u32(128));
  w.add_tensor_f32("a", GgmlType::kF32, {3}, {1, 2, 3});
  w.add_tensor_f32("b", GgmlType::kF32, {1}, {4});
  auto f = round_trip(w);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->alignment(), 128u);
  EXPECT_EQ(f->tensors()[1].offset, 128u);
  EXPECT_EQ(f->data_offset() % 128, 0u);
}

TEST(GgufWriterDeathTest, ImpossibleShapesAreBugs) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  GgufWriter w;
  EXPECT_DEATH(w.add_tensor("q", GgmlType::kQ8_0, {33}, std::vector<uint8_t>(34)), "not a multiple of the q8_0 block");
  EXPECT_DEATH(w.add_tensor("z", GgmlType::kF32, {4, 0}, std::vector<uint8_t>()), "dims\\[1\\] = 0");
  EXPECT_DEATH(w.add_tensor("n", GgmlType::kF32, {4}, std::vector<uint8_t>(15)), "15 bytes given, its type and dims need 16");
  EXPECT_DEATH(w.set_alignment(48), "alignment 48 is not a power of two");
  w.add_tensor("a", GgmlType::kF32, {1}, std::vector<uint8_t>(4));
  EXPECT_DEATH(w.add_tensor("a", GgmlType::kF32, {1}, std::vector<uint8_t>(4)), "tensor 'a' added twice");
}

TEST(GgufWriteFile, WritesAtomicallyAndMatchesToBytes) {
  const auto dir = testing::scratch_dir("gguf_write_file");
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_alignment(64);
  w.add_tensor_f32("w", GgmlType::kQ8_0, {32, 4}, random_values(128, 5));
  const std::string path = (dir / "m.gguf").string();
  ASSERT_TRUE(w.write(path).ok());
  ASSERT_TRUE(w.write(path).ok());  // replacing an existing file
  EXPECT_EQ(read_whole_file(path), w.to_bytes());
  // No temporary file is left beside it.
  size_t num_entries = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    ++num_entries;
    EXPECT_EQ(entry.path().filename(), "m.gguf");
  }
  EXPECT_EQ(num_entries, 1u);

  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f.value()->name(), path);
  EXPECT_EQ(f.value()->file_size(), std::filesystem::file_size(path));
  const GgufTensorInfo* t = f.value()->find_tensor("w");
  ASSERT_NE(t, nullptr);
  // The mapping is page aligned, so tensor data keeps the file's alignment in memory (zero-copy loads rely on it).
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % 64, 0u);

  const Status bad = w.write((dir / "no_such_dir" / "m.gguf").string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("no_such_dir/m.gguf"), std::string::npos) << bad.message();
  EXPECT_NE(bad.message().find("No such file or directory"), std::string::npos) << bad.message();
}

TEST(GgufOpen, MissingDirectoryEmptyAndFifoAreClearErrors) {
  const auto dir = testing::scratch_dir("gguf_open_errors");
  const std::string missing = (dir / "missing.gguf").string();
  auto r = GgufFile::open(missing);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), missing + ": cannot open: No such file or directory");

  r = GgufFile::open(dir.string());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), dir.string() + ": is a directory, not a GGUF file");

  const std::string empty = (dir / "empty.gguf").string();
  std::ofstream(empty).close();
  r = GgufFile::open(empty);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), empty + ": file is empty (0 bytes)");

  const std::string fifo = (dir / "fifo.gguf").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  r = GgufFile::open(fifo);  // must not block waiting for a writer
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), fifo + ": is not a regular file");

  const std::string truncated = (dir / "truncated.gguf").string();
  std::ofstream(truncated, std::ios::binary) << "GGUF\x03";
  r = GgufFile::open(truncated);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(truncated + ": header: version: truncated"), std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace kvlm
