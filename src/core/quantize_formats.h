// Per-format row quantizers and dequantizers behind quantize_row_reference /
// dequantize_row_reference (core/quantize.h). n is a multiple of the format's block size.
// Internal to core/.
#pragma once

#include <cstdint>

namespace kvlm::quant_formats {

// 32-element blocks (quantize_blocks32.cc).
void quantize_q4_1(const float* x, uint8_t* dst, int64_t n);
void quantize_q5_0(const float* x, uint8_t* dst, int64_t n);
void quantize_q5_1(const float* x, uint8_t* dst, int64_t n);
void quantize_iq4_nl(const float* x, uint8_t* dst, int64_t n);
void dequantize_q4_1(const uint8_t* src, float* y, int64_t n);
void dequantize_q5_0(const uint8_t* src, float* y, int64_t n);
void dequantize_q5_1(const uint8_t* src, float* y, int64_t n);
void dequantize_iq4_nl(const uint8_t* src, float* y, int64_t n);

// 256-element super-blocks (quantize_kquants.cc).
void quantize_q2_k(const float* x, uint8_t* dst, int64_t n);
void quantize_q3_k(const float* x, uint8_t* dst, int64_t n);
void quantize_q4_k(const float* x, uint8_t* dst, int64_t n);
void quantize_q5_k(const float* x, uint8_t* dst, int64_t n);
void quantize_q6_k(const float* x, uint8_t* dst, int64_t n);
void quantize_q8_k(const float* x, uint8_t* dst, int64_t n);
void quantize_iq4_xs(const float* x, uint8_t* dst, int64_t n);
void dequantize_q2_k(const uint8_t* src, float* y, int64_t n);
void dequantize_q3_k(const uint8_t* src, float* y, int64_t n);
void dequantize_q4_k(const uint8_t* src, float* y, int64_t n);
void dequantize_q5_k(const uint8_t* src, float* y, int64_t n);
void dequantize_q6_k(const uint8_t* src, float* y, int64_t n);
void dequantize_q8_k(const uint8_t* src, float* y, int64_t n);
void dequantize_iq4_xs(const uint8_t* src, float* y, int64_t n);

}  // namespace kvlm::quant_formats
