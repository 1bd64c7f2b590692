// Portable matmul kernels and activation quantizer: plain C++ for any CPU, also what
// KVLM_CPU=portable runs. Each output element is one dot product in a fixed order.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "ops/matmul_kernels.h"

namespace kvlm::ops_internal {
namespace {

// Rounds |v| < 2^22 to the nearest integer, ties to even: the float addition does the
// rounding, exactly like the SIMD cvtps instructions in the default rounding mode.
inline int32_t round_half_even(float v) {
  constexpr float kMagic = 12582912.0f;  // 1.5 · 2^23
  return static_cast<int32_t>((v + kMagic) - kMagic);
}

// Eight independent partial sums: the compiler can keep them in vector registers
// without reassociating anything.
constexpr int kPartials = 8;

// Row element loaders as types, so each dot product is compiled (and vectorized) per type.
struct F32Elements {
  static float at(const uint8_t* row, int64_t c) {
    float v;
    std::memcpy(&v, row + 4 * c, 4);
    return v;
  }
};

// Branch-free half -> float, so the dot product vectorizes: the half's exponent and mantissa
// moved into f32 position read as a value 2^112 too small, normals and subnormals alike;
// inf and nan take the f32 all-ones exponent instead.
inline float fp16_to_fp32_select(uint16_t h) {
  const uint32_t magnitude = static_cast<uint32_t>(h & 0x7fffu) << 13;
  float scaled;
  std::memcpy(&scaled, &magnitude, 4);
  scaled *= 0x1p112f;
  uint32_t bits;
  std::memcpy(&bits, &scaled, 4);
  const uint32_t inf_or_nan = 0u - static_cast<uint32_t>((h & 0x7c00u) == 0x7c00u);
  bits = (bits & ~inf_or_nan) | ((magnitude | 0x7f800000u) & inf_or_nan);
  bits |= static_cast<uint32_t>(h & 0x8000u) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

struct F16Elements {
  static float at(const uint8_t* row, int64_t c) {
    uint16_t h;
    std::memcpy(&h, row + 2 * c, 2);
    return fp16_to_fp32_select(h);
  }
};

struct Bf16Elements {
  static float at(const uint8_t* row, int64_t c) {
    uint16_t h;
    std::memcpy(&h, row + 2 * c, 2);
    return bf16_to_fp32(h);
  }
};

template <class Elements>
float dot_float(const uint8_t* row, const float* x, int64_t cols) {
  float partial[kPartials] = {};
  int64_t c = 0;
  for (; c + kPartials <= cols; c += kPartials) {
    for (int i = 0; i < kPartials; ++i) partial[i] += Elements::at(row, c + i) * x[c + i];
  }
  float sum = 0.0f;
  for (int i = 0; i < kPartials; ++i) sum += partial[i];
  for (; c < cols; ++c) sum += Elements::at(row, c) * x[c];
  return sum;
}

inline float block_scale(const uint8_t* block) {
  uint16_t d;
  std::memcpy(&d, block, 2);
  return fp16_to_fp32_select(d);
}

// Σ_blocks d_w·d_x·(integer dot of the block), summed block after block. The quants are read
// in place (int8_t may alias anything), which keeps the integer dot a plain vectorizable loop.
float dot_q8_0(const uint8_t* row, const int8_t* xq, const float* scales, int64_t num_blocks) {
  float sum = 0.0f;
  for (int64_t b = 0; b < num_blocks; ++b) {
    const uint8_t* block = row + b * static_cast<int64_t>(sizeof(BlockQ8_0));
    const int8_t* q = reinterpret_cast<const int8_t*>(block + 2);
    const int8_t* xb = xq + b * 32;
    int32_t dot = 0;
    for (int i = 0; i < 32; ++i) dot += q[i] * xb[i];
    sum += block_scale(block) * scales[b] * static_cast<float>(dot);
  }
  return sum;
}

// Q4_0 byte i holds element i (low nibble) and i+16 (high nibble), both stored + 8.
float dot_q4_0(const uint8_t* row, const int8_t* xq, const float* scales, int64_t num_blocks) {
  float sum = 0.0f;
  for (int64_t b = 0; b < num_blocks; ++b) {
    const uint8_t* block = row + b * static_cast<int64_t>(sizeof(BlockQ4_0));
    const uint8_t* q = block + 2;
    const int8_t* xb = xq + b * 32;
    int32_t dot = 0;
    for (int i = 0; i < 16; ++i) dot += ((q[i] & 0x0f) - 8) * xb[i] + ((q[i] >> 4) - 8) * xb[i + 16];
    sum += block_scale(block) * scales[b] * static_cast<float>(dot);
  }
  return sum;
}

}  // namespace

void quantize_activations_portable(const float* x, int64_t cols, int64_t token_begin, int64_t token_end,
                                   int32_t bias_offset, const QuantizedActivations& out) {
  const int64_t num_blocks = cols / 32;
  for (int64_t t = token_begin; t < token_end; ++t) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const float* xb = x + t * cols + b * 32;
      const int64_t block_idx = t * num_blocks + b;
      float amax = 0.0f;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xb[i]));
      const float d = amax / 127.0f;
      const float inv_d = amax != 0.0f ? 127.0f / amax : 0.0f;
      int8_t* q = out.qs + block_idx * 32;
      for (int i = 0; i < 32; ++i) q[i] = static_cast<int8_t>(round_half_even(xb[i] * inv_d));
      out.scales[block_idx] = d;
      for (int lane = 0; lane < 8 && bias_offset != 0; ++lane) {
        const int32_t lane_sum = q[4 * lane] + q[4 * lane + 1] + q[4 * lane + 2] + q[4 * lane + 3];
        out.bias[block_idx * 8 + lane] = -bias_offset * lane_sum;
      }
    }
  }
}

void matmul_rows_portable(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  count_isa_kernel_run(Isa::kPortable);
  const WeightMatrix& w = *p.w;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint8_t* row = w.data + static_cast<uint64_t>(r) * w.row_bytes;
    // The row stays in L1 while every token of the chunk uses it.
    for (int64_t t = p.token_begin; t < p.token_end; ++t) {
      const float* xt = p.x + t * w.cols;
      float v = 0.0f;
      switch (w.type) {
        case GgmlType::kF32:
          v = dot_float<F32Elements>(row, xt, w.cols);
          break;
        case GgmlType::kF16:
          v = dot_float<F16Elements>(row, xt, w.cols);
          break;
        case GgmlType::kBF16:
          v = dot_float<Bf16Elements>(row, xt, w.cols);
          break;
        case GgmlType::kQ8_0:
        case GgmlType::kQ4_0: {
          const QuantizedActivations& xq = *p.xq;
          const int8_t* qs = xq.qs + t * xq.num_blocks * 32;
          const float* scales = xq.scales + t * xq.num_blocks;
          v = w.type == GgmlType::kQ8_0 ? dot_q8_0(row, qs, scales, xq.num_blocks)
                                        : dot_q4_0(row, qs, scales, xq.num_blocks);
          break;
        }
        default:
          KVLM_CHECK(false, "matmul_rows_portable: weight type {}", ggml_type_name(w.type));
      }
      p.y[t * w.rows + r] = v;
    }
  }
}

}  // namespace kvlm::ops_internal
