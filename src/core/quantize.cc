#include "core/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "core/quantize_formats.h"

namespace kvlm {
namespace {

void quantize_q8_0(const float* src, BlockQ8_0* dst, int64_t num_blocks) {
  for (int64_t b = 0; b < num_blocks; ++b) {
    const float* x = src + b * kQ8_0BlockSize;
    float amax = 0.0f;
    for (int i = 0; i < kQ8_0BlockSize; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.0f;
    const float inv_d = d != 0.0f ? 1.0f / d : 0.0f;
    dst[b].d = fp32_to_fp16(d);
    for (int i = 0; i < kQ8_0BlockSize; ++i) dst[b].qs[i] = static_cast<int8_t>(std::lround(x[i] * inv_d));
  }
}

// Q4_0 maps the value of largest magnitude to -8 so its sign gets the wider half of the range.
void quantize_q4_0(const float* src, BlockQ4_0* dst, int64_t num_blocks) {
  for (int64_t b = 0; b < num_blocks; ++b) {
    const float* x = src + b * kQ4_0BlockSize;
    float amax = 0.0f;
    float max = 0.0f;
    for (int i = 0; i < kQ4_0BlockSize; ++i) {
      if (std::fabs(x[i]) > amax) {
        amax = std::fabs(x[i]);
        max = x[i];
      }
    }
    const float d = max / -8.0f;
    const float inv_d = d != 0.0f ? 1.0f / d : 0.0f;
    dst[b].d = fp32_to_fp16(d);
    for (int i = 0; i < kQ4_0BlockSize / 2; ++i) {
      const int lo = std::min(15, static_cast<int>(x[i] * inv_d + 8.5f));
      const int hi = std::min(15, static_cast<int>(x[i + kQ4_0BlockSize / 2] * inv_d + 8.5f));
      dst[b].qs[i] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

}  // namespace

uint64_t ggml_row_bytes(GgmlType type, int64_t n) {
  const GgmlTypeTraits t = ggml_type_traits(type);
  KVLM_CHECK(t.block_size > 0 && n % t.block_size == 0, "row of {} elements does not fit {} blocks", n, t.name);
  return static_cast<uint64_t>(n / t.block_size) * t.block_bytes;
}

void quantize_row_reference(GgmlType type, const float* src, uint8_t* dst, int64_t n) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_fp16(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_bf16(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case GgmlType::kQ8_0:
      KVLM_CHECK(n % kQ8_0BlockSize == 0, "q8_0 row of {} elements", n);
      quantize_q8_0(src, reinterpret_cast<BlockQ8_0*>(dst), n / kQ8_0BlockSize);
      return;
    case GgmlType::kQ4_0:
      KVLM_CHECK(n % kQ4_0BlockSize == 0, "q4_0 row of {} elements", n);
      quantize_q4_0(src, reinterpret_cast<BlockQ4_0*>(dst), n / kQ4_0BlockSize);
      return;
    default:
      break;
  }
  const GgmlTypeTraits traits = ggml_type_traits(type);
  KVLM_CHECK(traits.block_size > 0 && n % traits.block_size == 0, "{} row of {} elements", traits.name, n);
  switch (type) {
    case GgmlType::kQ4_1: return quant_formats::quantize_q4_1(src, dst, n);
    case GgmlType::kQ5_0: return quant_formats::quantize_q5_0(src, dst, n);
    case GgmlType::kQ5_1: return quant_formats::quantize_q5_1(src, dst, n);
    case GgmlType::kIQ4_NL: return quant_formats::quantize_iq4_nl(src, dst, n);
    case GgmlType::kQ2_K: return quant_formats::quantize_q2_k(src, dst, n);
    case GgmlType::kQ3_K: return quant_formats::quantize_q3_k(src, dst, n);
    case GgmlType::kQ4_K: return quant_formats::quantize_q4_k(src, dst, n);
    case GgmlType::kQ5_K: return quant_formats::quantize_q5_k(src, dst, n);
    case GgmlType::kQ6_K: return quant_formats::quantize_q6_k(src, dst, n);
    case GgmlType::kQ8_K: return quant_formats::quantize_q8_k(src, dst, n);
    case GgmlType::kIQ4_XS: return quant_formats::quantize_iq4_xs(src, dst, n);
    default:
      KVLM_CHECK(false, "cannot quantize to {}", ggml_type_name(type));
  }
}

void dequantize_row_reference(GgmlType type, const uint8_t* src, float* dst, int64_t n) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = fp16_to_fp32(h);
      }
      return;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = bf16_to_fp32(h);
      }
      return;
    case GgmlType::kQ8_0: {
      KVLM_CHECK(n % kQ8_0BlockSize == 0, "q8_0 row of {} elements", n);
      for (int64_t b = 0; b < n / kQ8_0BlockSize; ++b) {
        BlockQ8_0 block;
        std::memcpy(&block, src + b * sizeof(BlockQ8_0), sizeof block);
        const float d = fp16_to_fp32(block.d);
        for (int i = 0; i < kQ8_0BlockSize; ++i) dst[b * kQ8_0BlockSize + i] = d * block.qs[i];
      }
      return;
    }
    case GgmlType::kQ4_0: {
      KVLM_CHECK(n % kQ4_0BlockSize == 0, "q4_0 row of {} elements", n);
      for (int64_t b = 0; b < n / kQ4_0BlockSize; ++b) {
        BlockQ4_0 block;
        std::memcpy(&block, src + b * sizeof(BlockQ4_0), sizeof block);
        const float d = fp16_to_fp32(block.d);
        float* y = dst + b * kQ4_0BlockSize;
        for (int i = 0; i < kQ4_0BlockSize / 2; ++i) {
          y[i] = d * static_cast<float>((block.qs[i] & 0x0f) - 8);
          y[i + kQ4_0BlockSize / 2] = d * static_cast<float>((block.qs[i] >> 4) - 8);
        }
      }
      return;
    }
    default:
      break;
  }
  const GgmlTypeTraits traits = ggml_type_traits(type);
  KVLM_CHECK(traits.block_size > 0 && n % traits.block_size == 0, "{} row of {} elements", traits.name, n);
  switch (type) {
    case GgmlType::kQ4_1: return quant_formats::dequantize_q4_1(src, dst, n);
    case GgmlType::kQ5_0: return quant_formats::dequantize_q5_0(src, dst, n);
    case GgmlType::kQ5_1: return quant_formats::dequantize_q5_1(src, dst, n);
    case GgmlType::kIQ4_NL: return quant_formats::dequantize_iq4_nl(src, dst, n);
    case GgmlType::kQ2_K: return quant_formats::dequantize_q2_k(src, dst, n);
    case GgmlType::kQ3_K: return quant_formats::dequantize_q3_k(src, dst, n);
    case GgmlType::kQ4_K: return quant_formats::dequantize_q4_k(src, dst, n);
    case GgmlType::kQ5_K: return quant_formats::dequantize_q5_k(src, dst, n);
    case GgmlType::kQ6_K: return quant_formats::dequantize_q6_k(src, dst, n);
    case GgmlType::kQ8_K: return quant_formats::dequantize_q8_k(src, dst, n);
    case GgmlType::kIQ4_XS: return quant_formats::dequantize_iq4_xs(src, dst, n);
    default:
      KVLM_CHECK(false, "cannot dequantize {}", ggml_type_name(type));
  }
}

}  // namespace kvlm
