// Internal to ops/: weight blocks of the types added after Q8_0 / Q4_0, decoded into int8
// values and integer sub-block scales, and the portable row kernel over them
// (matmul_decoded_portable.cc): the readable reference the fused AVX2 / AVX-512 kernels
// (matmul_decode_avx2.h, matmul_super_<isa>.cc) must agree with.
//
// A 32-element block (Q4_1, Q5_0, Q5_1, IQ4_NL) is value = d·v + m with v int8.
// A 256-element super-block (Q2_K .. Q6_K, IQ4_XS) is value = d·k[s]·v - dmin·mn[s] for the
// 16-element sub-block s = e / 16, with v int8 and k, mn integers (32-element sub-blocks
// repeat their k and mn twice). Against int8 activations a with scale dx:
//   Σ value·x ≈ dx·(d·Σ_s k[s]·(Σ_{e in s} v·a) - dmin·Σ_s mn[s]·(Σ_{e in s} a)),
// the inner sums exact in int32 (|k·v·a| ≤ 128·128·127 per element, 2^16 elements would be
// needed to overflow; a super-block has 256).
//
// Everything here sits in an unnamed namespace on purpose: each ISA's file compiles its own
// copy with its own flags, and no copy may be merged with another's by the linker.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/quant_blocks.h"
#include "ops/matmul_kernels.h"

namespace kvlm::ops_internal {
namespace {

struct Decoded32 {
  alignas(32) int8_t v[32];
  float d;
  float m;
};

struct DecodedSuper {
  alignas(64) int8_t v[256];
  alignas(64) int16_t k[16];
  alignas(32) int16_t mn[16];
  float d;
  float dmin;
  bool non_negative;  // every v ≥ 0 (Q2_K, Q4_K, Q5_K): SIMD dots take v as the unsigned operand
};

inline float half_to_float(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_fp32(h);
}

inline void unpack_nibbles32(const uint8_t* qs, int8_t* v, int bias) {
  for (int i = 0; i < 16; ++i) {
    v[i] = static_cast<int8_t>((qs[i] & 15) - bias);
    v[i + 16] = static_cast<int8_t>((qs[i] >> 4) - bias);
  }
}

inline void add_fifth_bits(const uint8_t* qh, int8_t* v) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
  for (int i = 0; i < 32; ++i) v[i] = static_cast<int8_t>(v[i] + static_cast<int>((bits >> i) & 1) * 16);
}

inline void decode_block32(GgmlType type, const uint8_t* b, Decoded32& out) {
  switch (type) {
    case GgmlType::kQ4_1:
      out.d = half_to_float(b);
      out.m = half_to_float(b + 2);
      unpack_nibbles32(b + 4, out.v, 0);
      return;
    case GgmlType::kQ5_0:  // (q | h << 4) - 16 = (nibble - 16) + 16·h
      out.d = half_to_float(b);
      out.m = 0.0f;
      unpack_nibbles32(b + 6, out.v, 16);
      add_fifth_bits(b + 2, out.v);
      return;
    case GgmlType::kQ5_1:
      out.d = half_to_float(b);
      out.m = half_to_float(b + 2);
      unpack_nibbles32(b + 8, out.v, 0);
      add_fifth_bits(b + 4, out.v);
      return;
    case GgmlType::kIQ4_NL:
      out.d = half_to_float(b);
      out.m = 0.0f;
      for (int i = 0; i < 16; ++i) {
        out.v[i] = kIq4Values[b[2 + i] & 15];
        out.v[i + 16] = kIq4Values[b[2 + i] >> 4];
      }
      return;
    default:
      return;
  }
}

inline void decode_super(GgmlType type, const uint8_t* b, DecodedSuper& out) {
  out.non_negative = type == GgmlType::kQ2_K || type == GgmlType::kQ4_K || type == GgmlType::kQ5_K;
  switch (type) {
    case GgmlType::kQ2_K: {
      BlockQ2_K blk;
      std::memcpy(&blk, b, sizeof blk);
      out.d = fp16_to_fp32(blk.d);
      out.dmin = fp16_to_fp32(blk.dmin);
      for (int s = 0; s < 16; ++s) {
        out.k[s] = static_cast<int16_t>(blk.scales[s] & 15);
        out.mn[s] = static_cast<int16_t>(blk.scales[s] >> 4);
      }
      for (int half = 0; half < 2; ++half) {
        for (int j = 0; j < 4; ++j) {
          for (int l = 0; l < 32; ++l) out.v[128 * half + 32 * j + l] = static_cast<int8_t>((blk.qs[32 * half + l] >> (2 * j)) & 3);
        }
      }
      return;
    }
    case GgmlType::kQ3_K: {
      BlockQ3_K blk;
      std::memcpy(&blk, b, sizeof blk);
      out.d = fp16_to_fp32(blk.d);
      out.dmin = 0.0f;
      for (int s = 0; s < 16; ++s) {
        out.k[s] = static_cast<int16_t>(q3_k_scale(s, blk.scales));
        out.mn[s] = 0;
      }
      for (int half = 0; half < 2; ++half) {
        for (int j = 0; j < 4; ++j) {
          for (int l = 0; l < 32; ++l) {
            const int low = (blk.qs[32 * half + l] >> (2 * j)) & 3;
            const int high = (blk.hmask[l] >> (4 * half + j)) & 1;
            out.v[128 * half + 32 * j + l] = static_cast<int8_t>(low - 4 + 4 * high);
          }
        }
      }
      return;
    }
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K: {
      const bool five = type == GgmlType::kQ5_K;
      out.d = half_to_float(b);
      out.dmin = half_to_float(b + 2);
      const uint8_t* scales = b + 4;
      const uint8_t* qh = b + 16;
      const uint8_t* qs = b + (five ? 48 : 16);
      for (int j = 0; j < 8; ++j) {
        uint8_t sc, mn;
        k_scale_min(j, scales, &sc, &mn);
        out.k[2 * j] = out.k[2 * j + 1] = sc;
        out.mn[2 * j] = out.mn[2 * j + 1] = mn;
      }
      for (int c = 0; c < 4; ++c) {
        for (int l = 0; l < 32; ++l) {
          int lo = qs[32 * c + l] & 15, hi = qs[32 * c + l] >> 4;
          if (five) {
            lo |= ((qh[l] >> (2 * c)) & 1) << 4;
            hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
          }
          out.v[64 * c + l] = static_cast<int8_t>(lo);
          out.v[64 * c + 32 + l] = static_cast<int8_t>(hi);
        }
      }
      return;
    }
    case GgmlType::kQ6_K: {
      BlockQ6_K blk;
      std::memcpy(&blk, b, sizeof blk);
      out.d = fp16_to_fp32(blk.d);
      out.dmin = 0.0f;
      for (int s = 0; s < 16; ++s) {
        out.k[s] = blk.scales[s];
        out.mn[s] = 0;
      }
      for (int half = 0; half < 2; ++half) {
        const uint8_t* ql = blk.ql + 64 * half;
        const uint8_t* qh = blk.qh + 32 * half;
        int8_t* v = out.v + 128 * half;
        for (int l = 0; l < 32; ++l) {
          v[l] = static_cast<int8_t>(((ql[l] & 15) | (qh[l] & 3) << 4) - 32);
          v[l + 32] = static_cast<int8_t>(((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4) - 32);
          v[l + 64] = static_cast<int8_t>(((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32);
          v[l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32);
        }
      }
      return;
    }
    case GgmlType::kIQ4_XS: {
      BlockIq4Xs blk;
      std::memcpy(&blk, b, sizeof blk);
      out.d = fp16_to_fp32(blk.d);
      out.dmin = 0.0f;
      for (int s = 0; s < 8; ++s) {
        const int ls = (((blk.scales_l[s / 2] >> (4 * (s % 2))) & 15) | ((blk.scales_h >> (2 * s)) & 3) << 4) - 32;
        out.k[2 * s] = out.k[2 * s + 1] = static_cast<int16_t>(ls);
        out.mn[2 * s] = out.mn[2 * s + 1] = 0;
        for (int i = 0; i < 16; ++i) {
          out.v[32 * s + i] = kIq4Values[blk.qs[16 * s + i] & 15];
          out.v[32 * s + 16 + i] = kIq4Values[blk.qs[16 * s + i] >> 4];
        }
      }
      return;
    }
    default:
      return;
  }
}

// The row kernel, generic over the ISA's decoders and integer dots:
//   Dot::decode32(type, bytes, out), Dot::decode_super_block(type, bytes, out): as above
//   Dot::dot32(v, a): Σ_{i<32} v[i]·a[i]
//   Dot::dot_super(block, a): Σ_s k[s]·Σ_{e in s} v[e]·a[e] over a super-block
//   Dot::min_dot(block, bsums): Σ_s mn[s]·bsums[s]
// A row's blocks are decoded once and used by every token of the chunk; each (row, token)
// sums its blocks in order, so results do not depend on the split over threads or tokens.
template <class Dot>
void run_decoded_rows(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  const WeightMatrix& w = *p.w;
  const int64_t num_tokens = p.token_end - p.token_begin;
  thread_local std::vector<float> acc;
  acc.assign(static_cast<size_t>(num_tokens), 0.0f);
  const uint64_t block_bytes = ggml_type_traits(w.type).block_bytes;
  if (activation_format(w.type) == ActivationFormat::kBlocks32) {
    const QuantizedActivations& xq = *p.xq;
    for (int64_t r = row_begin; r < row_end; ++r) {
      const uint8_t* row = w.data + static_cast<uint64_t>(r) * w.row_bytes;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t b = 0; b < xq.num_blocks; ++b) {
        Decoded32 blk;
        Dot::decode32(w.type, row + static_cast<uint64_t>(b) * block_bytes, blk);
        for (int64_t t = 0; t < num_tokens; ++t) {
          const int64_t idx = (p.token_begin + t) * xq.num_blocks + b;
          const float dx = xq.scales[idx];
          float v = blk.d * dx * static_cast<float>(Dot::dot32(blk.v, xq.qs + idx * 32));
          if (blk.m != 0.0f) v += blk.m * dx * static_cast<float>(xq.sums[idx]);
          acc[t] += v;
        }
      }
      for (int64_t t = 0; t < num_tokens; ++t) p.y[(p.token_begin + t) * w.rows + r] = acc[t];
    }
    return;
  }
  const SuperBlockActivations& xk = *p.xk;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint8_t* row = w.data + static_cast<uint64_t>(r) * w.row_bytes;
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t b = 0; b < xk.num_blocks; ++b) {
      DecodedSuper blk;
      Dot::decode_super_block(w.type, row + static_cast<uint64_t>(b) * block_bytes, blk);
      for (int64_t t = 0; t < num_tokens; ++t) {
        const int64_t idx = (p.token_begin + t) * xk.num_blocks + b;
        const int32_t dot = Dot::dot_super(blk, xk.qs + idx * 256);
        const int32_t min_dot = blk.dmin != 0.0f ? Dot::min_dot(blk, xk.bsums + idx * 16) : 0;
        acc[t] += xk.scales[idx] * (blk.d * static_cast<float>(dot) - blk.dmin * static_cast<float>(min_dot));
      }
    }
    for (int64_t t = 0; t < num_tokens; ++t) p.y[(p.token_begin + t) * w.rows + r] = acc[t];
  }
}

}  // namespace
}  // namespace kvlm::ops_internal
