// The GGUF block layouts of Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K..Q6_K, Q8_K and IQ4_XS: the
// library's dequantization against a reader written here from the format description
// (element by element: where its bits are, which sub-block scale and min it takes), on blocks
// of random bytes (every scale, min, sign and code) and on the quantizers' own output.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/quant_blocks.h"
#include "core/quantize.h"

namespace kvlm {
namespace {

// What one element of a block says: value = scale·level(code) + offset, where level is the
// code itself (minus `bias`) or a grid entry; codes run over [0, num_codes).
struct Element {
  float scale = 0.0f;
  float offset = 0.0f;
  int code = 0;
  int num_codes = 0;
  int bias = 0;                  // level = code - bias (linear types)
  const int8_t* grid = nullptr;  // level = grid[code] (IQ4)
  float level(int c) const { return grid ? static_cast<float>(grid[c]) : static_cast<float>(c - bias); }
  float value() const { return scale * level(code) + offset; }
};

float f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_fp32(h);
}
int bit(const uint8_t* bytes, int index) { return (bytes[index / 8] >> (index % 8)) & 1; }
// The nibble for element i of a 32-value group packed as in Q4_0: byte i % 16, high half for i >= 16.
int nibble32(const uint8_t* qs, int i) { return (qs[i % 16] >> (4 * (i / 16))) & 15; }

// Reads element e (< block size) of one block of `type` straight from the description.
Element read_element(GgmlType type, const uint8_t* b, int e) {
  Element el;
  switch (type) {
    case GgmlType::kQ4_1:  // d, m, qs[16]
      return {f16(b), f16(b + 2), nibble32(b + 4, e), 16, 0, nullptr};
    case GgmlType::kQ5_0:  // d, qh[4], qs[16]
      return {f16(b), 0.0f, nibble32(b + 6, e) | bit(b + 2, e) << 4, 32, 16, nullptr};
    case GgmlType::kQ5_1:  // d, m, qh[4], qs[16]
      return {f16(b), f16(b + 2), nibble32(b + 8, e) | bit(b + 4, e) << 4, 32, 0, nullptr};
    case GgmlType::kIQ4_NL:  // d, qs[16]
      return {f16(b), 0.0f, nibble32(b + 2, e), 16, 0, kIq4Values};
    case GgmlType::kQ2_K: {  // scales[16], qs[64], d, dmin; element e is in sub-block e / 16
      const int half = e / 128, j = (e % 128) / 32, l = e % 32;
      const int q = (b[16 + 32 * half + l] >> (2 * j)) & 3;
      const uint8_t sm = b[e / 16];
      const float d = f16(b + 80), dmin = f16(b + 82);
      return {d * static_cast<float>(sm & 15), -(dmin * static_cast<float>(sm >> 4)), q, 4, 0, nullptr};
    }
    case GgmlType::kQ3_K: {  // hmask[32], qs[64], scales[12], d
      const int half = e / 128, j = (e % 128) / 32, l = e % 32, s = e / 16;
      const int low = (b[32 + 32 * half + l] >> (2 * j)) & 3;
      const int high = bit(b + l, 4 * half + j);
      // 6-bit scale s: low 4 bits are nibble (s / 8) of byte (s % 8); high 2 bits are bit
      // pair (s / 4) of byte 8 + s % 4.
      const uint8_t* sc = b + 96;
      const int v = ((sc[s % 8] >> (4 * (s / 8))) & 15) | ((sc[8 + s % 4] >> (2 * (s / 4))) & 3) << 4;
      // code = high·4 + low encodes q = code - 4 (high bit clear: low - 4, set: low).
      return {f16(b + 108) * static_cast<float>(v - 32), 0.0f, high * 4 + low, 8, 4, nullptr};
    }
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K: {  // d, dmin, scales[12], (qh[32]), qs[128]
      const bool five = type == GgmlType::kQ5_K;
      const int s = e / 32, c = e / 64, l = e % 32, upper = (e % 64) / 32;
      const uint8_t* sc = b + 4;
      const uint8_t* qs = b + (five ? 48 : 16);
      int q = (qs[32 * c + l] >> (4 * upper)) & 15;
      if (five) q |= bit(b + 16 + l, 2 * c + upper) << 4;
      // Scales and mins 0-3: low 6 bits of bytes 0-3 and 4-7. 4-7: low 4 bits from the low
      // (scale) and high (min) nibble of bytes 8-11, top 2 bits from bits 6-7 of bytes 0-3
      // (scales) and 4-7 (mins).
      const int scale = s < 4 ? sc[s] & 63 : (sc[s + 4] & 15) | (sc[s - 4] >> 6) << 4;
      const int min = s < 4 ? sc[s + 4] & 63 : (sc[s + 4] >> 4) | (sc[s] >> 6) << 4;
      return {f16(b) * static_cast<float>(scale), -(f16(b + 2) * static_cast<float>(min)), q, five ? 32 : 16, 0,
              nullptr};
    }
    case GgmlType::kQ6_K: {  // ql[128], qh[64], scales[16] (int8), d
      const int half = e / 128, k = (e % 128) / 32, l = e % 32;
      const int low = (b[64 * half + 32 * (k % 2) + l] >> (4 * (k / 2))) & 15;
      const int high = (b[128 + 32 * half + l] >> (2 * k)) & 3;
      const int8_t scale = static_cast<int8_t>(b[192 + e / 16]);
      return {f16(b + 208) * static_cast<float>(scale), 0.0f, low | high << 4, 64, 32, nullptr};
    }
    case GgmlType::kQ8_K: {  // d (f32), qs[256], bsums[16]
      float d;
      std::memcpy(&d, b, 4);
      return {d, 0.0f, static_cast<int8_t>(b[4 + e]) + 128, 256, 128, nullptr};
    }
    case GgmlType::kIQ4_XS: {  // d, scales_h (u16), scales_l[4], qs[128]
      const int s = e / 32, i = e % 32;
      const int ls = ((b[4 + s / 2] >> (4 * (s % 2))) & 15) | bit(b + 2, 2 * s) << 4 | bit(b + 2, 2 * s + 1) << 5;
      return {f16(b) * static_cast<float>(ls - 32), 0.0f, nibble32(b + 8 + 16 * s, i), 16, 0, kIq4Values};
    }
    default:
      ADD_FAILURE() << "no reader for " << ggml_type_name(type);
  }
  return el;
}

const std::vector<GgmlType>& new_types() {
  static const std::vector<GgmlType> types = {GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kIQ4_NL,
                                              GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K,
                                              GgmlType::kQ6_K, GgmlType::kQ8_K, GgmlType::kIQ4_XS};
  return types;
}

class BlockLayoutTest : public ::testing::TestWithParam<GgmlType> {};

// Random bytes everywhere except the f16 / f32 super-scales (kept finite): every code, every
// scale and min value of every sub-block index, both signs, appear many times over 64 blocks.
TEST_P(BlockLayoutTest, DequantizeMatchesDescriptionOnRandomBlocks) {
  const GgmlType type = GetParam();
  const GgmlTypeTraits t = ggml_type_traits(type);
  std::mt19937 rng(static_cast<uint32_t>(type) + 1);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(-2.0f, 2.0f);
  const int num_blocks = 64;
  std::vector<uint8_t> bytes(num_blocks * t.block_bytes);
  for (uint8_t& v : bytes) v = static_cast<uint8_t>(byte(rng));
  for (int blk = 0; blk < num_blocks; ++blk) {
    uint8_t* b = bytes.data() + blk * t.block_bytes;
    // Where the block keeps its f16 scales (Q8_K: an f32 d at byte 0).
    auto put16 = [&](int off) {
      const uint16_t h = fp32_to_fp16(blk == 0 ? 0.0f : scale(rng));
      std::memcpy(b + off, &h, 2);
    };
    switch (type) {
      case GgmlType::kQ2_K: put16(80); put16(82); break;
      case GgmlType::kQ3_K: put16(108); break;
      case GgmlType::kQ6_K: put16(208); break;
      case GgmlType::kQ4_K: case GgmlType::kQ5_K: case GgmlType::kQ4_1: case GgmlType::kQ5_1: put16(0); put16(2); break;
      case GgmlType::kQ8_K: { const float d = scale(rng); std::memcpy(b, &d, 4); break; }
      default: put16(0); break;
    }
  }
  std::vector<float> y(num_blocks * t.block_size);
  dequantize_row_reference(type, bytes.data(), y.data(), static_cast<int64_t>(y.size()));
  std::vector<int> codes_seen(256, 0);
  for (int blk = 0; blk < num_blocks; ++blk) {
    for (uint32_t e = 0; e < t.block_size; ++e) {
      const Element el = read_element(type, bytes.data() + blk * t.block_bytes, static_cast<int>(e));
      ++codes_seen[el.code];
      ASSERT_EQ(y[blk * t.block_size + e], el.value()) << ggml_type_name(type) << " block " << blk << " element " << e;
    }
  }
  const int num_codes = read_element(type, bytes.data(), 0).num_codes;
  for (int c = 0; c < num_codes; ++c) EXPECT_GT(codes_seen[c], 0) << "code " << c << " never drawn";
}

// All-ones and all-zeros payloads: the extreme codes, scales and mins together.
TEST_P(BlockLayoutTest, DequantizeMatchesDescriptionOnSaturatedBlocks) {
  const GgmlType type = GetParam();
  const GgmlTypeTraits t = ggml_type_traits(type);
  for (uint8_t fill : {uint8_t{0x00}, uint8_t{0xff}, uint8_t{0x55}, uint8_t{0xaa}}) {
    std::vector<uint8_t> b(t.block_bytes, fill);
    const uint16_t h = fp32_to_fp16(0.75f);
    const float f = 0.75f;
    if (type == GgmlType::kQ8_K) std::memcpy(b.data(), &f, 4);
    else if (type == GgmlType::kQ2_K) { std::memcpy(&b[80], &h, 2); std::memcpy(&b[82], &h, 2); }
    else if (type == GgmlType::kQ3_K) std::memcpy(&b[108], &h, 2);
    else if (type == GgmlType::kQ6_K) std::memcpy(&b[208], &h, 2);
    else {
      std::memcpy(b.data(), &h, 2);
      if (type == GgmlType::kQ4_1 || type == GgmlType::kQ5_1 || type == GgmlType::kQ4_K || type == GgmlType::kQ5_K) {
        std::memcpy(&b[2], &h, 2);
      }
    }
    std::vector<float> y(t.block_size);
    dequantize_row_reference(type, b.data(), y.data(), t.block_size);
    for (uint32_t e = 0; e < t.block_size; ++e) {
      ASSERT_EQ(y[e], read_element(type, b.data(), static_cast<int>(e)).value())
          << ggml_type_name(type) << " fill " << int{fill} << " element " << e;
    }
  }
}

// The quantizer codes every element with the level nearest it under the scale and min the
// block stores (decoded): no element could be closer with another code of its sub-block.
// And the error over Gaussian rows is at most what a plain grid over each sub-block's range
// would give in the worst case, see below.
TEST_P(BlockLayoutTest, QuantizerPicksNearestLevelAndBoundsError) {
  const GgmlType type = GetParam();
  const GgmlTypeTraits t = ggml_type_traits(type);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t n = 16 * 256;
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = normal(rng) * (1.0f + static_cast<float>((i / 512) % 4));
  x[100] = 0.0f;
  for (int i = 512; i < 768; ++i) x[i] = 0.0f;  // an all-zero super-block
  for (int i = 1024; i < 1056; ++i) x[i] = 3.0f;  // a constant group
  std::vector<uint8_t> bytes(ggml_row_bytes(type, n));
  quantize_row_reference(type, x.data(), bytes.data(), n);
  std::vector<float> y(n);
  dequantize_row_reference(type, bytes.data(), y.data(), n);
  double err2 = 0.0, sig2 = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const Element el = read_element(type, bytes.data() + (i / t.block_size) * t.block_bytes,
                                    static_cast<int>(i % t.block_size));
    ASSERT_EQ(y[i], el.value());
    const float err = std::fabs(x[i] - y[i]);
    for (int c = 0; c < el.num_codes; ++c) {
      const float other = std::fabs(x[i] - (el.scale * el.level(c) + el.offset));
      // 1e-6 relative: the quantizer divides by the scale where this multiplies.
      ASSERT_LE(err, other + 1e-6f * (std::fabs(x[i]) + std::fabs(el.offset)) + 1e-30f)
          << ggml_type_name(type) << " element " << i << " code " << el.code << " but " << c << " is closer";
    }
    err2 += static_cast<double>(err) * err;
    sig2 += static_cast<double>(x[i]) * x[i];
  }
  // Worst case of a plain grid laid over each sub-block's range [lo, hi]: an element is at most
  // half a step from a level. A linear grid of L codes steps (hi - lo) / (L - 2) if one code is
  // given up to place the grid (a symmetric grid's extra negative level; an affine min rounded
  // to its own grid); IQ4's grid spans 240 units with gaps up to 24, so half a gap is
  // (hi - lo) / 20. The search tries that plain grid among its candidates and keeps the best,
  // so its squared error cannot exceed this sum, but for the sub-block scales' own coding on
  // the super-block grid (K-quants, IQ4_XS): a scale code moves the step by at most half a
  // grid unit of the largest scale, at most 1/(2·(2^6 - 1)) = 0.8% of it (4-bit Q2_K: 3.3%),
  // which the factor (1 + that)² covers when the sub-block ranges are within a factor of 4 of
  // the largest (the rows here vary by 4 only between super-blocks).
  int sub = 32;
  double half_step_per_range = 0.0, scale_grid = 0.0;
  const Element probe = read_element(type, bytes.data(), 0);
  switch (type) {
    case GgmlType::kQ2_K: sub = 16; scale_grid = 1.0 / 30; break;
    case GgmlType::kQ3_K: case GgmlType::kQ6_K: sub = 16; scale_grid = 4.0 / 126; break;
    case GgmlType::kQ4_K: case GgmlType::kQ5_K: case GgmlType::kIQ4_XS: scale_grid = 4.0 / 126; break;
    case GgmlType::kQ8_K: sub = 256; break;
    default: break;
  }
  half_step_per_range = probe.grid ? 1.0 / 20 : 0.5 / (probe.num_codes - 2);
  double bound2 = 0.0;
  for (int64_t s0 = 0; s0 < n; s0 += sub) {
    float lo = x[s0], hi = x[s0];
    for (int i = 1; i < sub; ++i) lo = std::min(lo, x[s0 + i]), hi = std::max(hi, x[s0 + i]);
    const double h = (hi - lo) * half_step_per_range * (1.0 + scale_grid);
    bound2 += sub * h * h;
  }
  EXPECT_LE(err2, bound2) << ggml_type_name(type);
  RecordProperty("relative_rms_error", fmt::format("{:.4g}", std::sqrt(err2 / sig2)));
  std::printf("%s relative rms error %.4g (bound %.4g)\n", std::string(ggml_type_name(type)).c_str(),
              std::sqrt(err2 / sig2), std::sqrt(bound2 / sig2));
}

INSTANTIATE_TEST_SUITE_P(Types, BlockLayoutTest, ::testing::ValuesIn(new_types()),
                         [](const ::testing::TestParamInfo<GgmlType>& info) {
                           return std::string(ggml_type_name(info.param));
                         });

TEST(GgmlTypes, EveryGgufTypeIsKnown) {
  struct Row { uint32_t id; const char* name; uint32_t block_size, block_bytes; bool supported; };
  const Row rows[] = {
      {2, "q4_0", 32, 18, true},      {3, "q4_1", 32, 20, true},       {6, "q5_0", 32, 22, true},
      {7, "q5_1", 32, 24, true},      {8, "q8_0", 32, 34, true},       {9, "q8_1", 32, 36, false},
      {10, "q2_k", 256, 84, true},    {11, "q3_k", 256, 110, true},    {12, "q4_k", 256, 144, true},
      {13, "q5_k", 256, 176, true},   {14, "q6_k", 256, 210, true},    {15, "q8_k", 256, 292, false},
      {16, "iq2_xxs", 256, 66, false}, {17, "iq2_xs", 256, 74, false}, {18, "iq3_xxs", 256, 98, false},
      {19, "iq1_s", 256, 50, false},  {20, "iq4_nl", 32, 18, true},    {21, "iq3_s", 256, 110, false},
      {22, "iq2_s", 256, 82, false},  {23, "iq4_xs", 256, 136, true},  {24, "i8", 1, 1, false},
      {25, "i16", 1, 2, false},       {26, "i32", 1, 4, false},        {27, "i64", 1, 8, false},
      {28, "f64", 1, 8, false},       {29, "iq1_m", 256, 56, false},   {30, "bf16", 1, 2, true},
      {31, "q4_0_4_4", 32, 18, false}, {34, "tq1_0", 256, 54, false},  {35, "tq2_0", 256, 66, false},
      {36, "iq4_nl_4_4", 32, 18, false}, {39, "mxfp4", 32, 17, false}, {40, "nvfp4", 64, 36, false},
      {41, "q1_0", 128, 18, false},   {42, "q2_0", 64, 18, false},
  };
  for (const Row& r : rows) {
    const auto t = ggml_type_traits(r.id);
    ASSERT_TRUE(t.has_value()) << r.id;
    EXPECT_EQ(t->name, r.name);
    EXPECT_EQ(t->block_size, r.block_size) << r.name;
    EXPECT_EQ(t->block_bytes, r.block_bytes) << r.name;
    EXPECT_EQ(t->supported, r.supported) << r.name;
    EXPECT_EQ(parse_ggml_type(r.name), static_cast<GgmlType>(r.id)) << r.name;
  }
  EXPECT_EQ(parse_ggml_type("Q4_K"), GgmlType::kQ4_K);
  EXPECT_EQ(parse_ggml_type("IQ4_XS"), GgmlType::kIQ4_XS);
  EXPECT_FALSE(ggml_type_traits(uint32_t{4}).has_value());  // removed Q4_2
  EXPECT_FALSE(ggml_type_traits(uint32_t{43}).has_value());
}

}  // namespace
}  // namespace kvlm
