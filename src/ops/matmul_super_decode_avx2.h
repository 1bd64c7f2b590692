// Internal to ops/: register decoders of the 256-element super-block types (Q2_K .. Q6_K,
// IQ4_XS) for the fused kernels (matmul_super_avx2.cc, matmul_super_avx512.cc), which dot the
// codes with int8 activations straight from these registers, never through memory.
//
// Each type T gives, per super-block b (bytes of one row):
//   T::scales(b) → SuperScales: d, dmin and int16 vectors k16 / mn16, one lane per 16-element
//     sub-block s (32-element sub-blocks fill two lanes);
//   T::values<P>(b, v0, v1): elements 64P .. 64P+31 and 64P+32 .. 64P+63 (P < 4), one byte each,
//     in element order, so they line up with 64 contiguous activation bytes.
// Codes come in one of three kinds (T::kKind), all exact in int32 against activations a:
//   kUnsignedMin  (Q2_K, Q4_K, Q5_K): value = d·k·u - dmin·mn, u ≥ 0 ≤ 31;
//                 Σ value·a = d·Σ_s k·Σ u·a - dmin·Σ_s mn·bsum_s.
//   kUnsignedOffset (Q3_K, Q6_K): value = d·k·(u - o), u ≥ 0 ≤ 63; mn16 holds o·k, so
//                 Σ value·a = d·(Σ_s k·Σ u·a - Σ_s mn·bsum_s).
//   kSigned       (IQ4_XS): value = d·k·v with v in [-127, 113]: vpmaddubsw takes |v| and a·sign(v).
// u ≤ 63 and |a| ≤ 127 keep vpmaddubsw's int16 pair sums below 2^15 (2·63·127 = 16002).
// Unnamed namespace: each ISA's file compiles its own copy with its own flags.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "core/quant_blocks.h"
#include "ops/half_f16c.h"

namespace kvlm::ops_internal {
namespace {

enum class CodeKind { kUnsignedMin, kUnsignedOffset, kSigned };

struct SuperScales {
  __m256i k16;   // int16 [16]  scale of each 16-element sub-block
  __m256i mn16;  // int16 [16]  min (kUnsignedMin) or offset·scale (kUnsignedOffset); else unused
  float d;
  float dmin;    // 0 unless kUnsignedMin
};

namespace super_decode {

inline __m256i load256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m128i load128(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Bit `from` of every byte of x moved to bit `to` (all other bits cleared). 16-bit shifts are
// safe: a bit never crosses into the neighbouring byte for from, to < 8.
template <int kFrom, int kTo>
inline __m256i move_bit(__m256i x) {
  const __m256i mask = _mm256_set1_epi8(static_cast<char>(1 << kTo));
  if constexpr (kFrom > kTo) return _mm256_and_si256(_mm256_srli_epi16(x, kFrom - kTo), mask);
  if constexpr (kFrom < kTo) return _mm256_and_si256(_mm256_slli_epi16(x, kTo - kFrom), mask);
  return _mm256_and_si256(x, mask);
}

// 8 per-32 sub-block scales (bytes, low 64 bits of x) → 16 int16 lanes, each twice.
inline __m256i widen_pairs(__m128i bytes8) {
  const __m128i w = _mm_cvtepu8_epi16(bytes8);
  return _mm256_set_m128i(_mm_unpackhi_epi16(w, w), _mm_unpacklo_epi16(w, w));
}

}  // namespace super_decode

// Q4_K / Q5_K scales: 12 bytes packing 8 six-bit scales and 8 six-bit mins (k_scale_min).
inline SuperScales k_quant_scales_6bit(const uint8_t* b) {
  using namespace super_decode;
  const uint32_t s0 = load_u32(b + 4), s1 = load_u32(b + 8), s2 = load_u32(b + 12);
  const uint32_t sc_lo = s0 & 0x3f3f3f3fu;
  const uint32_t mn_lo = s1 & 0x3f3f3f3fu;
  const uint32_t sc_hi = (s2 & 0x0f0f0f0fu) | (((s0 >> 6) & 0x03030303u) << 4);
  const uint32_t mn_hi = ((s2 >> 4) & 0x0f0f0f0fu) | (((s1 >> 6) & 0x03030303u) << 4);
  SuperScales s;
  s.k16 = widen_pairs(_mm_cvtsi64_si128(static_cast<int64_t>(sc_lo | uint64_t{sc_hi} << 32)));
  s.mn16 = widen_pairs(_mm_cvtsi64_si128(static_cast<int64_t>(mn_lo | uint64_t{mn_hi} << 32)));
  s.d = half_f16c(b);
  s.dmin = half_f16c(b + 2);
  return s;
}

struct SuperQ2K {  // scales[16] (scale | min << 4), qs[64], d, dmin
  static constexpr CodeKind kKind = CodeKind::kUnsignedMin;
  static constexpr int kBytes = sizeof(BlockQ2_K);
  static SuperScales scales(const uint8_t* b) {
    using namespace super_decode;
    const __m128i packed = load128(b);
    const __m128i m4 = _mm_set1_epi8(15);
    SuperScales s;
    s.k16 = _mm256_cvtepu8_epi16(_mm_and_si128(packed, m4));
    s.mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), m4));
    s.d = half_f16c(b + 80);
    s.dmin = half_f16c(b + 82);
    return s;
  }
  // Element 128h + 32j + l is bits 2j, 2j+1 of qs[32h + l].
  template <int P>
  static void values(const uint8_t* b, __m256i& v0, __m256i& v1) {
    using namespace super_decode;
    const __m256i q = load256(b + 16 + 32 * (P / 2));
    const __m256i m2 = _mm256_set1_epi8(3);
    constexpr int j = 2 * (P % 2);
    v0 = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m2);
    v1 = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j + 2), m2);
  }
};

struct SuperQ3K {  // hmask[32], qs[64], scales[12], d; value = d·k·(low + 4·high - 4)
  static constexpr CodeKind kKind = CodeKind::kUnsignedOffset;
  static constexpr int kBytes = sizeof(BlockQ3_K);
  static SuperScales scales(const uint8_t* b) {
    using namespace super_decode;
    uint64_t low8;
    std::memcpy(&low8, b + 96, 8);
    const uint32_t h = load_u32(b + 104);
    const uint64_t low_a = low8 & 0x0f0f0f0f0f0f0f0full;         // sub-blocks 0-7
    const uint64_t low_b = (low8 >> 4) & 0x0f0f0f0f0f0f0f0full;  // sub-blocks 8-15
    const uint64_t high_a = (h & 0x03030303u) | uint64_t{(h >> 2) & 0x03030303u} << 32;
    const uint64_t high_b = ((h >> 4) & 0x03030303u) | uint64_t{(h >> 6) & 0x03030303u} << 32;
    const __m128i raw = _mm_set_epi64x(static_cast<int64_t>(low_b | high_b << 4), static_cast<int64_t>(low_a | high_a << 4));
    return from_raw(raw, b);
  }
  // raw: the 16 six-bit scales, one per byte, stored + 32.
  static SuperScales from_raw(__m128i raw, const uint8_t* b) {
    SuperScales s;
    s.k16 = _mm256_cvtepi8_epi16(_mm_sub_epi8(raw, _mm_set1_epi8(32)));
    s.mn16 = _mm256_slli_epi16(s.k16, 2);  // offset 4
    s.d = half_f16c(b + 108);
    s.dmin = 0.0f;
    return s;
  }
  // Element 128h + 32j + l: low bits 2j, 2j+1 of qs[32h + l], high bit 4h + j of hmask[l].
  template <int P>
  static void values(const uint8_t* b, __m256i& v0, __m256i& v1) {
    using namespace super_decode;
    constexpr int h = P / 2, j = 2 * (P % 2);
    const __m256i q = load256(b + 32 + 32 * h);
    const __m256i hm = load256(b);
    const __m256i m2 = _mm256_set1_epi8(3);
    v0 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m2), move_bit<4 * h + j, 2>(hm));
    v1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 2 * j + 2), m2), move_bit<4 * h + j + 1, 2>(hm));
  }
};

struct SuperQ4K {  // d, dmin, scales[12], qs[128]
  static constexpr CodeKind kKind = CodeKind::kUnsignedMin;
  static constexpr int kBytes = sizeof(BlockQ4_K);
  static SuperScales scales(const uint8_t* b) { return k_quant_scales_6bit(b); }
  // Element 64P + l is the low nibble of qs[32P + l], element 64P + 32 + l its high nibble.
  template <int P>
  static void values(const uint8_t* b, __m256i& v0, __m256i& v1) {
    using namespace super_decode;
    const __m256i q = load256(b + 16 + 32 * P);
    const __m256i m4 = _mm256_set1_epi8(15);
    v0 = _mm256_and_si256(q, m4);
    v1 = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
  }
};

struct SuperQ5K {  // d, dmin, scales[12], qh[32], qs[128]
  static constexpr CodeKind kKind = CodeKind::kUnsignedMin;
  static constexpr int kBytes = sizeof(BlockQ5_K);
  static SuperScales scales(const uint8_t* b) { return k_quant_scales_6bit(b); }
  // As Q4_K, bit 4 from bit 2P (low nibbles) or 2P+1 (high nibbles) of qh[l].
  template <int P>
  static void values(const uint8_t* b, __m256i& v0, __m256i& v1) {
    using namespace super_decode;
    const __m256i q = load256(b + 48 + 32 * P);
    const __m256i qh = load256(b + 16);
    const __m256i m4 = _mm256_set1_epi8(15);
    v0 = _mm256_or_si256(_mm256_and_si256(q, m4), move_bit<2 * P, 4>(qh));
    v1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), move_bit<2 * P + 1, 4>(qh));
  }
};

struct SuperQ6K {  // ql[128], qh[64], scales[16] (int8), d; value = d·k·(q - 32)
  static constexpr CodeKind kKind = CodeKind::kUnsignedOffset;
  static constexpr int kBytes = sizeof(BlockQ6_K);
  static SuperScales scales(const uint8_t* b) {
    using namespace super_decode;
    SuperScales s;
    s.k16 = _mm256_cvtepi8_epi16(load128(b + 192));
    s.mn16 = _mm256_slli_epi16(s.k16, 5);  // offset 32: |32·k| ≤ 4096
    s.d = half_f16c(b + 208);
    s.dmin = 0.0f;
    return s;
  }
  // Half h = P / 2 (128 elements) takes ql[64h ..], qh[32h ..]; element 128h + 32i + l
  // (i < 4) has low nibble from ql[64h + 32(i % 2) + l] (i < 2: low, else high nibble) and
  // bits 2i, 2i+1 of qh[32h + l] as bits 4, 5.
  template <int P>
  static void values(const uint8_t* b, __m256i& v0, __m256i& v1) {
    using namespace super_decode;
    constexpr int h = P / 2, i = 2 * (P % 2);
    const __m256i ql0 = load256(b + 64 * h);
    const __m256i ql1 = load256(b + 64 * h + 32);
    const __m256i qh = load256(b + 128 + 32 * h);
    const __m256i m4 = _mm256_set1_epi8(15);
    const __m256i m_high = _mm256_set1_epi8(0x30);
    auto high = [&](int shift) {  // bits shift, shift+1 → 4, 5
      if (shift < 4) return _mm256_and_si256(_mm256_slli_epi16(qh, 4 - shift), m_high);
      if (shift > 4) return _mm256_and_si256(_mm256_srli_epi16(qh, shift - 4), m_high);
      return _mm256_and_si256(qh, m_high);
    };
    const __m256i lo0 = i == 0 ? _mm256_and_si256(ql0, m4) : _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4);
    const __m256i lo1 = i == 0 ? _mm256_and_si256(ql1, m4) : _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4);
    v0 = _mm256_or_si256(lo0, high(2 * i));
    v1 = _mm256_or_si256(lo1, high(2 * i + 2));
  }
};

struct SuperIq4Xs {  // d, scales_h (u16), scales_l[4], qs[128]; value = d·(ls - 32)·grid[q]
  static constexpr CodeKind kKind = CodeKind::kSigned;
  static constexpr int kBytes = sizeof(BlockIq4Xs);
  static SuperScales scales(const uint8_t* b) {
    using namespace super_decode;
    uint16_t h;
    std::memcpy(&h, b + 2, 2);
    const uint32_t l = load_u32(b + 4);
    // Sub-block s: low nibble s % 2 of scales_l[s / 2], bits 2s, 2s+1 of scales_h. Nibbles go
    // to bytes by interleaving l with l >> 4; the 2-bit fields of h by halving spreads in a u64.
    const __m128i lv = _mm_cvtsi32_si128(static_cast<int>(l));
    const __m128i low = _mm_and_si128(_mm_unpacklo_epi8(lv, _mm_srli_epi16(lv, 4)), _mm_set1_epi8(15));
    uint64_t high = h;
    high = (high | high << 24) & 0x000000ff000000ffull;
    high = (high | high << 12) & 0x000f000f000f000full;
    high = (high | high << 6) & 0x0303030303030303ull;
    const __m128i packed = _mm_or_si128(low, _mm_cvtsi64_si128(static_cast<int64_t>(high << 4)));
    SuperScales s;
    s.k16 = _mm256_sub_epi16(widen_pairs(packed), _mm256_set1_epi16(32));
    s.mn16 = _mm256_setzero_si256();
    s.d = half_f16c(b);
    s.dmin = 0.0f;
    return s;
  }
  // Sub-block s (32 elements): element 32s + i is grid[low nibble of qs[16s + i]],
  // 32s + 16 + i grid[its high nibble].
  template <int P>
  static void values(const uint8_t* b, __m256i& v0, __m256i& v1) {
    using namespace super_decode;
    // Each 16 code bytes are broadcast to both lanes (a load, no shuffle port) and the upper
    // lane shifted to its high nibbles, so no cross-lane permute is needed.
    const __m256i m4 = _mm256_set1_epi8(15);
    const __m256i lane_shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    const __m256i grid2 = _mm256_broadcastsi128_si256(load128(reinterpret_cast<const uint8_t*>(kIq4Values)));
    auto sub_block = [&](const uint8_t* q) {
      const __m256i both = _mm256_broadcastsi128_si256(load128(q));
      return _mm256_shuffle_epi8(grid2, _mm256_and_si256(_mm256_srlv_epi32(both, lane_shift), m4));
    };
    v0 = sub_block(b + 8 + 32 * P);
    v1 = sub_block(b + 8 + 32 * P + 16);
  }
};

}  // namespace
}  // namespace kvlm::ops_internal
