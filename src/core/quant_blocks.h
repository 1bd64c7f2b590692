// GGML block layouts beyond Q8_0/Q4_0 (dtype.h), byte for byte as GGUF stores them.
// Scales are f16 bit patterns unless noted. "Element i" counts from the block's start.
#pragma once

#include <cstdint>
#include <cstring>

namespace kvlm {

inline constexpr int kQK = 32;    // elements of a Q4_1 / Q5_x / IQ4_NL block
inline constexpr int kQKK = 256;  // elements of a K-quant / IQ4_XS super-block
inline constexpr int kKScaleBytes = 12;

// Block b of a row, copied out (rows need not be aligned for the struct), and back.
template <class Block>
Block load_block(const uint8_t* src, int64_t b) {
  Block block;
  std::memcpy(&block, src + b * static_cast<int64_t>(sizeof(Block)), sizeof block);
  return block;
}

template <class Block>
void store_block(const Block& block, uint8_t* dst, int64_t b) {
  std::memcpy(dst + b * static_cast<int64_t>(sizeof(Block)), &block, sizeof block);
}

// value = d·q + m; q 4 bits: element i in the low nibble of qs[i], i+16 in the high nibble.
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ4_1) == 20);

// value = d·(q - 16); q = nibble (as Q4_0) | bit i of qh (little-endian u32) << 4.
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_0) == 22);

// value = d·q + m; q as Q5_0.
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_1) == 24);

// value = d·kIq4Values[nibble]; nibbles as Q4_0.
struct BlockIq4Nl {
  uint16_t d;
  uint8_t qs[16];
};
static_assert(sizeof(BlockIq4Nl) == 18);

// The non-linear 4-bit grid of IQ4_NL and IQ4_XS.
inline constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// 16 sub-blocks of 16. Sub-block s: scale = scales[s] & 15, min = scales[s] >> 4.
// Element 128·n + 32·j + l (n < 2, j < 4, l < 32) is (qs[32·n + l] >> 2j) & 3, in sub-block
// 8·n + 2·j + l / 16. value = d·scale·q - dmin·min.
struct BlockQ2_K {
  uint8_t scales[16];
  uint8_t qs[64];
  uint16_t d;
  uint16_t dmin;
};
static_assert(sizeof(BlockQ2_K) == 84);

// 16 sub-blocks of 16. Element 128·n + 32·j + l: low = (qs[32·n + l] >> 2j) & 3, high bit =
// bit (4·n + j) of hmask[l]; q = low - 4 when the high bit is clear, else low (q in [-4, 3]).
// Sub-block s = 8·n + 2·j + l / 16 has a 6-bit scale: low 4 bits from scales[s] (s < 8) or
// scales[s - 8] >> 4 (s >= 8), high 2 bits = (scales[8 + s % 4] >> 2·(s / 4)) & 3; the signed
// scale is that minus 32. value = d·scale·q.
struct BlockQ3_K {
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];
  uint16_t d;
};
static_assert(sizeof(BlockQ3_K) == 110);

// 8 sub-blocks of 32 with 6-bit scale and min (k_scale_min below). Element 64·c + l (c < 4,
// l < 32) is qs[32·c + l] & 15 in sub-block 2c, element 64·c + 32 + l is qs[32·c + l] >> 4
// in sub-block 2c+1. value = d·scale·q - dmin·min.
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
static_assert(sizeof(BlockQ4_K) == 144);

// As Q4_K, with a fifth bit: element 64·c + l takes bit 2c of qh[l], element 64·c + 32 + l
// bit 2c+1 of qh[l], as bit 4 of q.
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
static_assert(sizeof(BlockQ5_K) == 176);

// 16 sub-blocks of 16 with int8 scales. In half n (< 2), for l < 32:
//   element 128n + l      = (ql[64n + l] & 15)      | ((qh[32n + l] >> 0) & 3) << 4
//   element 128n + l + 32 = (ql[64n + l + 32] & 15) | ((qh[32n + l] >> 2) & 3) << 4
//   element 128n + l + 64 = (ql[64n + l] >> 4)      | ((qh[32n + l] >> 4) & 3) << 4
//   element 128n + l + 96 = (ql[64n + l + 32] >> 4) | ((qh[32n + l] >> 6) & 3) << 4
// each minus 32; element e is in sub-block e / 16. value = d·scales[e / 16]·q.
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210);

// The K-quants' activation type: value = d·qs[i] (d is f32), bsums[k] = Σ qs[16k .. 16k+15].
struct BlockQ8_K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];
};
static_assert(sizeof(BlockQ8_K) == 292);

// 8 sub-blocks of 32; sub-block s has the 6-bit scale ls = ((scales_l[s / 2] >> 4·(s % 2)) & 15)
// | ((scales_h >> 2s) & 3) << 4, and value = d·(ls - 32)·kIq4Values[nibble], nibbles of
// qs[16s .. 16s+15] laid out as in IQ4_NL.
struct BlockIq4Xs {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[4];
  uint8_t qs[128];
};
static_assert(sizeof(BlockIq4Xs) == 136);

// Q4_K / Q5_K: the 6-bit scale and min of sub-block j (< 8) from the 12 packed bytes.
// Bytes 0-3 hold scales 0-3 (low 6 bits), bytes 4-7 mins 0-3; scales and mins 4-7 take their
// low 4 bits from the nibbles of bytes 8-11 and their top 2 bits from the top bits of bytes 0-7.
inline void k_scale_min(int j, const uint8_t* q, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = static_cast<uint8_t>((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
    *min = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Q3_K: the signed 6-bit scale of sub-block s (< 16).
inline int q3_k_scale(int s, const uint8_t* scales) {
  const int low = s < 8 ? scales[s] & 15 : scales[s - 8] >> 4;
  const int high = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
  return (low | high << 4) - 32;
}

}  // namespace kvlm
