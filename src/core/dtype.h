// Element types: GGML weight types (ids as in the GGUF format) and scalar conversions.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace kvlm {

// Tensor element types, numbered as GGUF stores them (ggml_type). Every id a GGUF file may
// hold is named, including ids GGML has since removed (31-33, 36-38: repacked layouts that
// files no longer carry) so a reader can say what it refuses.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kQ4_0_4_4 = 31,  // removed from GGML
  kQ4_0_4_8 = 32,  // removed
  kQ4_0_8_8 = 33,  // removed
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kIQ4_NL_4_4 = 36,  // removed
  kIQ4_NL_4_8 = 37,  // removed
  kIQ4_NL_8_8 = 38,  // removed
  kMXFP4 = 39,
  kNVFP4 = 40,
  kQ1_0 = 41,  // ids 40-42 as the llama.cpp build in shared/anchors writes them
  kQ2_0 = 42,
};

// Layout facts of one GGML type: `block_size` elements are stored in `block_bytes` bytes.
struct GgmlTypeTraits {
  std::string_view name;
  uint32_t block_size = 0;
  uint32_t block_bytes = 0;
  bool supported = false;  // kvlm can compute with it (matmul, dequantize, quantize)
};

// Traits for a raw type id read from a file; nullopt when the id is unknown.
std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t raw_type);
GgmlTypeTraits ggml_type_traits(GgmlType type);
std::string_view ggml_type_name(GgmlType type);
// Parses any type name ggml_type_name returns ("q4_k", "iq4_xs", ...), case-insensitive.
std::optional<GgmlType> parse_ggml_type(std::string_view name);
// Names of the supported types, comma-separated, for help texts and error messages.
std::string_view supported_ggml_type_names();

// GGML block layouts, exactly as stored in GGUF files.
inline constexpr int kQ8_0BlockSize = 32;
struct BlockQ8_0 {
  uint16_t d;          // f16 scale
  int8_t qs[32];       // value = d * qs[i]
};
static_assert(sizeof(BlockQ8_0) == 34);

inline constexpr int kQ4_0BlockSize = 32;
struct BlockQ4_0 {
  uint16_t d;          // f16 scale
  uint8_t qs[16];      // element i in low nibble of qs[i], element i+16 in the high nibble; value = d * (q - 8)
};
static_assert(sizeof(BlockQ4_0) == 18);

// IEEE half <-> float, portable bit manipulation (round to nearest even).
inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t fp32_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to inf
  if (abs < 0x38800000u) {  // result is subnormal or zero: units of 2^-24, exact scaling then round-to-even
    float magnitude;
    std::memcpy(&magnitude, &abs, sizeof magnitude);
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(magnitude * 16777216.0f)));
  }
  uint32_t result = ((abs - 0x38000000u) >> 13);
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (result & 1u))) ++result;
  return static_cast<uint16_t>(sign | result);
}

inline float bf16_to_fp32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t fp32_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet nan
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

}  // namespace kvlm
