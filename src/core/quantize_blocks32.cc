// Q4_1, Q5_0, Q5_1 and IQ4_NL: 32-element blocks with one f16 scale (and min).
// Quantizers search a scale (and min) per block (quant_search), store it as f16, then code
// every element with the level nearest it under the stored, decoded scale.
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/quant_blocks.h"
#include "core/quantize_formats.h"
#include "core/quantize_search.h"

namespace kvlm::quant_formats {
namespace {

using quant_search::clamp_round;

// Packs 32 codes of up to 4 bits as Q4_0 does: element i low nibble, i+16 high nibble.
void pack_nibbles(const uint8_t* q, uint8_t* qs) {
  for (int i = 0; i < 16; ++i) qs[i] = static_cast<uint8_t>((q[i] & 15) | (q[i + 16] & 15) << 4);
}

void pack_fifth_bits(const uint8_t* q, uint8_t* qh) {
  uint32_t bits = 0;
  for (int i = 0; i < 32; ++i) bits |= static_cast<uint32_t>((q[i] >> 4) & 1) << i;
  std::memcpy(qh, &bits, 4);  // little-endian, as GGUF
}

// The 4-bit (or 5-bit with qh) code of element i.
inline int nibble_at(const uint8_t* qs, int i) { return i < 16 ? qs[i] & 15 : qs[i - 16] >> 4; }
inline int fifth_bit_at(const uint8_t* qh, int i) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
  return static_cast<int>((bits >> i) & 1);
}

// Affine blocks (Q4_1 / Q5_1): search (d, m), store them as f16, code with the decoded pair.
void code_affine(const float* x, int qmax, uint16_t* d_bits, uint16_t* m_bits, uint8_t* q) {
  float d = 0.0f, m = 0.0f;
  quant_search::fit_affine(x, kQK, qmax, quant_search::MinRule::kAny, q, &d, &m);
  *d_bits = fp32_to_fp16(d);
  *m_bits = fp32_to_fp16(m);
  const float dd = fp16_to_fp32(*d_bits);
  const float dm = fp16_to_fp32(*m_bits);
  for (int i = 0; i < kQK; ++i) q[i] = static_cast<uint8_t>(dd > 0.0f ? clamp_round((x[i] - dm) / dd, 0, qmax) : 0);
}

}  // namespace

void quantize_q4_1(const float* x, uint8_t* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    BlockQ4_1 block;
    uint8_t q[kQK];
    code_affine(x + b * kQK, 15, &block.d, &block.m, q);
    pack_nibbles(q, block.qs);
    store_block(block, dst, b);
  }
}

void quantize_q5_1(const float* x, uint8_t* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    BlockQ5_1 block;
    uint8_t q[kQK];
    code_affine(x + b * kQK, 31, &block.d, &block.m, q);
    pack_nibbles(q, block.qs);
    pack_fifth_bits(q, block.qh);
    store_block(block, dst, b);
  }
}

void quantize_q5_0(const float* x, uint8_t* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* xb = x + b * kQK;
    int8_t s[kQK];
    BlockQ5_0 block;
    block.d = fp32_to_fp16(quant_search::fit_symmetric(xb, kQK, -16, 15, s));
    const float d = fp16_to_fp32(block.d);
    uint8_t q[kQK];
    for (int i = 0; i < kQK; ++i) q[i] = static_cast<uint8_t>((d != 0.0f ? clamp_round(xb[i] / d, -16, 15) : 0) + 16);
    pack_nibbles(q, block.qs);
    pack_fifth_bits(q, block.qh);
    store_block(block, dst, b);
  }
}

void quantize_iq4_nl(const float* x, uint8_t* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* xb = x + b * kQK;
    uint8_t q[kQK];
    BlockIq4Nl block;
    block.d = fp32_to_fp16(quant_search::fit_grid(xb, kQK, kIq4Values, q));
    const float d = fp16_to_fp32(block.d);
    for (int i = 0; i < kQK; ++i) {
      q[i] = static_cast<uint8_t>(quant_search::nearest_grid_index(kIq4Values, d != 0.0f ? xb[i] / d : 0.0f));
    }
    pack_nibbles(q, block.qs);
    store_block(block, dst, b);
  }
}

void dequantize_q4_1(const uint8_t* src, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    const auto block = load_block<BlockQ4_1>(src, b);
    const float d = fp16_to_fp32(block.d), m = fp16_to_fp32(block.m);
    for (int i = 0; i < kQK; ++i) y[b * kQK + i] = d * static_cast<float>(nibble_at(block.qs, i)) + m;
  }
}

void dequantize_q5_0(const uint8_t* src, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    const auto block = load_block<BlockQ5_0>(src, b);
    const float d = fp16_to_fp32(block.d);
    for (int i = 0; i < kQK; ++i) {
      const int q = nibble_at(block.qs, i) | fifth_bit_at(block.qh, i) << 4;
      y[b * kQK + i] = d * static_cast<float>(q - 16);
    }
  }
}

void dequantize_q5_1(const uint8_t* src, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    const auto block = load_block<BlockQ5_1>(src, b);
    const float d = fp16_to_fp32(block.d), m = fp16_to_fp32(block.m);
    for (int i = 0; i < kQK; ++i) {
      const int q = nibble_at(block.qs, i) | fifth_bit_at(block.qh, i) << 4;
      y[b * kQK + i] = d * static_cast<float>(q) + m;
    }
  }
}

void dequantize_iq4_nl(const uint8_t* src, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    const auto block = load_block<BlockIq4Nl>(src, b);
    const float d = fp16_to_fp32(block.d);
    for (int i = 0; i < kQK; ++i) y[b * kQK + i] = d * static_cast<float>(kIq4Values[nibble_at(block.qs, i)]);
  }
}

}  // namespace kvlm::quant_formats
