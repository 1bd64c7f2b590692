// The K-quants (Q2_K .. Q6_K), their activation type Q8_K, and IQ4_XS: 256-element
// super-blocks whose sub-block scales (and mins) are themselves quantized against one or two
// f16 super-block scales. Quantizers: per sub-block, the least-squares scale (and min) of
// quant_search; the sub-block scales are then coded on the super-block's grid (largest one
// at the grid's end), and every element is coded with the level nearest it under the
// decoded sub-block scale and min, which is what the file will really say.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/quant_blocks.h"
#include "core/quantize_formats.h"
#include "core/quantize_search.h"

namespace kvlm::quant_formats {
namespace {

using quant_search::clamp_round;

// Affine sub-blocks (Q2_K, Q4_K, Q5_K): per sub-block d_s ≥ 0 and min_s = -m ≥ 0, then the
// super-block scales d = max d_s / scale_max and dmin = max min_s / scale_max (as f16), the
// codes sc_s = round(d_s / d) and mq_s = round(min_s / dmin), and the element codes.
struct AffineSuperBlock {
  uint16_t d = 0, dmin = 0;
  uint8_t sc[16] = {}, mq[16] = {};
  uint8_t q[kQKK] = {};
};

AffineSuperBlock code_affine_super(const float* x, int sub_size, int qmax, int scale_max) {
  const int num_sub = kQKK / sub_size;
  float d_s[16], min_s[16];
  AffineSuperBlock out;
  for (int s = 0; s < num_sub; ++s) {
    float m = 0.0f;
    quant_search::fit_affine(x + s * sub_size, sub_size, qmax, quant_search::MinRule::kNonPositiveMin,
                             out.q + s * sub_size, &d_s[s], &m);
    min_s[s] = -m;
  }
  const float max_d = *std::max_element(d_s, d_s + num_sub);
  const float max_min = *std::max_element(min_s, min_s + num_sub);
  out.d = fp32_to_fp16(max_d / static_cast<float>(scale_max));
  out.dmin = fp32_to_fp16(max_min / static_cast<float>(scale_max));
  const float dd = fp16_to_fp32(out.d), ddmin = fp16_to_fp32(out.dmin);
  for (int s = 0; s < num_sub; ++s) {
    out.sc[s] = static_cast<uint8_t>(dd > 0.0f ? clamp_round(d_s[s] / dd, 0, scale_max) : 0);
    out.mq[s] = static_cast<uint8_t>(ddmin > 0.0f ? clamp_round(min_s[s] / ddmin, 0, scale_max) : 0);
    const float ds = dd * out.sc[s], ms = ddmin * out.mq[s];
    for (int i = 0; i < sub_size; ++i) {
      const int e = s * sub_size + i;
      out.q[e] = static_cast<uint8_t>(ds > 0.0f ? clamp_round((x[e] + ms) / ds, 0, qmax) : 0);
    }
  }
  return out;
}

// Symmetric sub-blocks (Q3_K, Q6_K, IQ4_XS): the signed sub-block scale of largest
// magnitude goes to the grid's negative end (-32 or -128, the side with one more code).
// Returns the super-block scale (f16) and writes the signed sub-block codes.
uint16_t code_symmetric_scales(const float* d_s, int num_sub, int scale_min, int scale_max, int* sc) {
  float dmax = 0.0f;
  for (int s = 0; s < num_sub; ++s) {
    if (std::fabs(d_s[s]) > std::fabs(dmax)) dmax = d_s[s];
  }
  const uint16_t d = fp32_to_fp16(dmax / static_cast<float>(scale_min));
  const float dd = fp16_to_fp32(d);
  for (int s = 0; s < num_sub; ++s) sc[s] = dd != 0.0f ? clamp_round(d_s[s] / dd, scale_min, scale_max) : 0;
  return d;
}

// Q4_K / Q5_K: the inverse of k_scale_min.
void pack_k_scales(const uint8_t* sc, const uint8_t* mq, uint8_t* q) {
  std::memset(q, 0, kKScaleBytes);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      q[j] = static_cast<uint8_t>(q[j] | (sc[j] & 63));
      q[j + 4] = static_cast<uint8_t>(q[j + 4] | (mq[j] & 63));
    } else {
      q[j + 4] = static_cast<uint8_t>((sc[j] & 15) | (mq[j] & 15) << 4);
      q[j - 4] = static_cast<uint8_t>(q[j - 4] | (sc[j] >> 4) << 6);
      q[j] = static_cast<uint8_t>(q[j] | (mq[j] >> 4) << 6);
    }
  }
}

void quantize_q45_k(const float* x, uint8_t* dst, int64_t n, bool five_bits) {
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const AffineSuperBlock sb = code_affine_super(x + b * kQKK, 32, five_bits ? 31 : 15, 63);
    uint8_t scales[kKScaleBytes];
    pack_k_scales(sb.sc, sb.mq, scales);
    uint8_t qs[128];
    uint8_t qh[32] = {};
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t lo = sb.q[64 * c + l], hi = sb.q[64 * c + 32 + l];
        qs[32 * c + l] = static_cast<uint8_t>((lo & 15) | (hi & 15) << 4);
        qh[l] = static_cast<uint8_t>(qh[l] | ((lo >> 4) & 1) << (2 * c) | ((hi >> 4) & 1) << (2 * c + 1));
      }
    }
    if (five_bits) {
      BlockQ5_K block;
      block.d = sb.d;
      block.dmin = sb.dmin;
      std::memcpy(block.scales, scales, sizeof scales);
      std::memcpy(block.qh, qh, sizeof qh);
      std::memcpy(block.qs, qs, sizeof qs);
      store_block(block, dst, b);
    } else {
      BlockQ4_K block;
      block.d = sb.d;
      block.dmin = sb.dmin;
      std::memcpy(block.scales, scales, sizeof scales);
      std::memcpy(block.qs, qs, sizeof qs);
      store_block(block, dst, b);
    }
  }
}

}  // namespace

void quantize_q2_k(const float* x, uint8_t* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const AffineSuperBlock sb = code_affine_super(x + b * kQKK, 16, 3, 15);
    BlockQ2_K block{};
    block.d = sb.d;
    block.dmin = sb.dmin;
    for (int s = 0; s < 16; ++s) block.scales[s] = static_cast<uint8_t>(sb.sc[s] | sb.mq[s] << 4);
    for (int half = 0; half < 2; ++half) {
      for (int j = 0; j < 4; ++j) {
        for (int l = 0; l < 32; ++l) {
          block.qs[32 * half + l] =
              static_cast<uint8_t>(block.qs[32 * half + l] | sb.q[128 * half + 32 * j + l] << (2 * j));
        }
      }
    }
    store_block(block, dst, b);
  }
}

void quantize_q3_k(const float* x, uint8_t* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const float* xb = x + b * kQKK;
    float d_s[16];
    int8_t unused[16];
    for (int s = 0; s < 16; ++s) d_s[s] = quant_search::fit_symmetric(xb + 16 * s, 16, -4, 3, unused);
    int sc[16];
    BlockQ3_K block{};
    block.d = code_symmetric_scales(d_s, 16, -32, 31, sc);
    const float dd = fp16_to_fp32(block.d);
    for (int s = 0; s < 16; ++s) {
      const int v = sc[s] + 32;
      if (s < 8) {
        block.scales[s] = static_cast<uint8_t>(block.scales[s] | (v & 15));
      } else {
        block.scales[s - 8] = static_cast<uint8_t>(block.scales[s - 8] | (v & 15) << 4);
      }
      block.scales[8 + s % 4] = static_cast<uint8_t>(block.scales[8 + s % 4] | (v >> 4) << (2 * (s / 4)));
    }
    for (int half = 0; half < 2; ++half) {
      for (int j = 0; j < 4; ++j) {
        for (int l = 0; l < 32; ++l) {
          const int e = 128 * half + 32 * j + l;
          const float ds = dd * static_cast<float>(sc[e / 16]);
          const int u = (ds != 0.0f ? clamp_round(xb[e] / ds, -4, 3) : 0) + 4;  // low 2 bits + high bit
          block.qs[32 * half + l] = static_cast<uint8_t>(block.qs[32 * half + l] | (u & 3) << (2 * j));
          block.hmask[l] = static_cast<uint8_t>(block.hmask[l] | (u >> 2) << (4 * half + j));
        }
      }
    }
    store_block(block, dst, b);
  }
}

void quantize_q4_k(const float* x, uint8_t* dst, int64_t n) { quantize_q45_k(x, dst, n, false); }
void quantize_q5_k(const float* x, uint8_t* dst, int64_t n) { quantize_q45_k(x, dst, n, true); }

void quantize_q6_k(const float* x, uint8_t* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const float* xb = x + b * kQKK;
    float d_s[16];
    int8_t unused[16];
    for (int s = 0; s < 16; ++s) d_s[s] = quant_search::fit_symmetric(xb + 16 * s, 16, -32, 31, unused);
    int sc[16];
    BlockQ6_K block{};
    block.d = code_symmetric_scales(d_s, 16, -128, 127, sc);
    const float dd = fp16_to_fp32(block.d);
    uint8_t u[kQKK];
    for (int e = 0; e < kQKK; ++e) {
      block.scales[e / 16] = static_cast<int8_t>(sc[e / 16]);
      const float ds = dd * static_cast<float>(sc[e / 16]);
      u[e] = static_cast<uint8_t>((ds != 0.0f ? clamp_round(xb[e] / ds, -32, 31) : 0) + 32);
    }
    for (int half = 0; half < 2; ++half) {
      const uint8_t* v = u + 128 * half;
      for (int l = 0; l < 32; ++l) {
        block.ql[64 * half + l] = static_cast<uint8_t>((v[l] & 15) | (v[l + 64] & 15) << 4);
        block.ql[64 * half + l + 32] = static_cast<uint8_t>((v[l + 32] & 15) | (v[l + 96] & 15) << 4);
        block.qh[32 * half + l] =
            static_cast<uint8_t>(v[l] >> 4 | (v[l + 32] >> 4) << 2 | (v[l + 64] >> 4) << 4 | (v[l + 96] >> 4) << 6);
      }
    }
    store_block(block, dst, b);
  }
}

void quantize_q8_k(const float* x, uint8_t* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const float* xb = x + b * kQKK;
    float amax = 0.0f;
    for (int i = 0; i < kQKK; ++i) amax = std::max(amax, std::fabs(xb[i]));
    BlockQ8_K block{};
    block.d = amax / 127.0f;
    const float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int i = 0; i < kQKK; ++i) {
      block.qs[i] = static_cast<int8_t>(clamp_round(xb[i] * inv, -127, 127));
      block.bsums[i / 16] = static_cast<int16_t>(block.bsums[i / 16] + block.qs[i]);
    }
    store_block(block, dst, b);
  }
}

void quantize_iq4_xs(const float* x, uint8_t* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const float* xb = x + b * kQKK;
    float d_s[8];
    uint8_t idx[32];
    for (int s = 0; s < 8; ++s) d_s[s] = quant_search::fit_grid(xb + 32 * s, 32, kIq4Values, idx);
    int sc[8];
    BlockIq4Xs block{};
    block.d = code_symmetric_scales(d_s, 8, -32, 31, sc);
    const float dd = fp16_to_fp32(block.d);
    for (int s = 0; s < 8; ++s) {
      const int v = sc[s] + 32;
      block.scales_l[s / 2] = static_cast<uint8_t>(block.scales_l[s / 2] | (v & 15) << (4 * (s % 2)));
      block.scales_h = static_cast<uint16_t>(block.scales_h | (v >> 4) << (2 * s));
      const float ds = dd * static_cast<float>(sc[s]);
      for (int i = 0; i < 32; ++i) {
        idx[i] = static_cast<uint8_t>(quant_search::nearest_grid_index(kIq4Values, ds != 0.0f ? xb[32 * s + i] / ds : 0.0f));
      }
      for (int i = 0; i < 16; ++i) block.qs[16 * s + i] = static_cast<uint8_t>(idx[i] | idx[i + 16] << 4);
    }
    store_block(block, dst, b);
  }
}

void dequantize_q2_k(const uint8_t* src, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const auto block = load_block<BlockQ2_K>(src, b);
    const float d = fp16_to_fp32(block.d), dmin = fp16_to_fp32(block.dmin);
    float* yb = y + b * kQKK;
    for (int half = 0; half < 2; ++half) {
      for (int j = 0; j < 4; ++j) {
        for (int l = 0; l < 32; ++l) {
          const int s = 8 * half + 2 * j + l / 16;
          const int q = (block.qs[32 * half + l] >> (2 * j)) & 3;
          yb[128 * half + 32 * j + l] =
              d * static_cast<float>(block.scales[s] & 15) * static_cast<float>(q) - dmin * static_cast<float>(block.scales[s] >> 4);
        }
      }
    }
  }
}

void dequantize_q3_k(const uint8_t* src, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const auto block = load_block<BlockQ3_K>(src, b);
    const float d = fp16_to_fp32(block.d);
    float* yb = y + b * kQKK;
    for (int half = 0; half < 2; ++half) {
      for (int j = 0; j < 4; ++j) {
        for (int l = 0; l < 32; ++l) {
          const int s = 8 * half + 2 * j + l / 16;
          const int low = (block.qs[32 * half + l] >> (2 * j)) & 3;
          const int q = (block.hmask[l] >> (4 * half + j)) & 1 ? low : low - 4;
          yb[128 * half + 32 * j + l] = d * static_cast<float>(q3_k_scale(s, block.scales)) * static_cast<float>(q);
        }
      }
    }
  }
}

void dequantize_q4_k(const uint8_t* src, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const auto block = load_block<BlockQ4_K>(src, b);
    const float d = fp16_to_fp32(block.d), dmin = fp16_to_fp32(block.dmin);
    float* yb = y + b * kQKK;
    for (int c = 0; c < 4; ++c) {
      uint8_t sc0, m0, sc1, m1;
      k_scale_min(2 * c, block.scales, &sc0, &m0);
      k_scale_min(2 * c + 1, block.scales, &sc1, &m1);
      for (int l = 0; l < 32; ++l) {
        yb[64 * c + l] = d * static_cast<float>(sc0) * static_cast<float>(block.qs[32 * c + l] & 15) - dmin * static_cast<float>(m0);
        yb[64 * c + 32 + l] = d * static_cast<float>(sc1) * static_cast<float>(block.qs[32 * c + l] >> 4) - dmin * static_cast<float>(m1);
      }
    }
  }
}

void dequantize_q5_k(const uint8_t* src, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const auto block = load_block<BlockQ5_K>(src, b);
    const float d = fp16_to_fp32(block.d), dmin = fp16_to_fp32(block.dmin);
    float* yb = y + b * kQKK;
    for (int c = 0; c < 4; ++c) {
      uint8_t sc0, m0, sc1, m1;
      k_scale_min(2 * c, block.scales, &sc0, &m0);
      k_scale_min(2 * c + 1, block.scales, &sc1, &m1);
      for (int l = 0; l < 32; ++l) {
        const int q0 = (block.qs[32 * c + l] & 15) | ((block.qh[l] >> (2 * c)) & 1) << 4;
        const int q1 = (block.qs[32 * c + l] >> 4) | ((block.qh[l] >> (2 * c + 1)) & 1) << 4;
        yb[64 * c + l] = d * static_cast<float>(sc0) * static_cast<float>(q0) - dmin * static_cast<float>(m0);
        yb[64 * c + 32 + l] = d * static_cast<float>(sc1) * static_cast<float>(q1) - dmin * static_cast<float>(m1);
      }
    }
  }
}

void dequantize_q6_k(const uint8_t* src, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const auto block = load_block<BlockQ6_K>(src, b);
    const float d = fp16_to_fp32(block.d);
    float* yb = y + b * kQKK;
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = block.ql + 64 * half;
      const uint8_t* qh = block.qh + 32 * half;
      float* yh = yb + 128 * half;
      for (int l = 0; l < 32; ++l) {
        const int q[4] = {
            ((ql[l] & 15) | ((qh[l] >> 0) & 3) << 4) - 32,
            ((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4) - 32,
            ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32,
            ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32,
        };
        for (int k = 0; k < 4; ++k) {
          const int e = l + 32 * k;
          yh[e] = d * static_cast<float>(block.scales[8 * half + e / 16]) * static_cast<float>(q[k]);
        }
      }
    }
  }
}

void dequantize_q8_k(const uint8_t* src, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const auto block = load_block<BlockQ8_K>(src, b);
    for (int i = 0; i < kQKK; ++i) y[b * kQKK + i] = block.d * static_cast<float>(block.qs[i]);
  }
}

void dequantize_iq4_xs(const uint8_t* src, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const auto block = load_block<BlockIq4Xs>(src, b);
    const float d = fp16_to_fp32(block.d);
    for (int s = 0; s < 8; ++s) {
      const int ls = (((block.scales_l[s / 2] >> (4 * (s % 2))) & 15) | ((block.scales_h >> (2 * s)) & 3) << 4) - 32;
      const float dl = d * static_cast<float>(ls);
      const uint8_t* qs = block.qs + 16 * s;
      float* ys = y + b * kQKK + 32 * s;
      for (int i = 0; i < 16; ++i) {
        ys[i] = dl * static_cast<float>(kIq4Values[qs[i] & 15]);
        ys[i + 16] = dl * static_cast<float>(kIq4Values[qs[i] >> 4]);
      }
    }
  }
}

}  // namespace kvlm::quant_formats
