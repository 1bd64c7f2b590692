// Internal to ops/: AVX2 decoders of the weight blocks in matmul_decode.h, producing exactly
// what decode_block32 / decode_super produce (tests compare every ISA against the reference).
// Included only by files compiled with AVX2 (matmul_decoded_avx2.cc, matmul_decoded_avx512.cc);
// unnamed namespace for the same reason as matmul_decode.h.
#pragma once

#include <immintrin.h>

#include "ops/matmul_decode.h"

namespace kvlm::ops_internal {
namespace {

inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

// 16 bytes of nibbles → 32 bytes: low nibbles (elements 0-15), then high nibbles (16-31).
inline __m256i nibbles_to_bytes(__m128i packed) {
  const __m128i mask = _mm_set1_epi8(0x0f);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), mask), _mm_and_si128(packed, mask));
}

// 32 bits (little-endian u32) → 32 bytes of 0 or `value`: byte i is `value` when bit i is set.
inline __m256i bits_to_bytes(uint32_t bits, int8_t value) {
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int32_t>(bits)),
                                             _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
                                                              2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(value));
}

// Σ_s mn[s]·bsums[s] with one vpmaddwd (|mn| ≤ 63, |bsums| ≤ 2032).
inline int32_t min_dot_avx2(const DecodedSuper& blk, const int16_t* bsums) {
  const __m256i p = _mm256_madd_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(blk.mn)), load256(bsums));
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

inline __m256i iq4_lookup(__m256i idx) {
  const __m128i grid = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4Values));
  return _mm256_shuffle_epi8(_mm256_set_m128i(grid, grid), idx);
}

inline void decode_block32_avx2(GgmlType type, const uint8_t* b, Decoded32& out) {
  uint32_t qh;
  __m256i v;
  switch (type) {
    case GgmlType::kQ4_1:
      out.d = half_to_float(b);
      out.m = half_to_float(b + 2);
      v = nibbles_to_bytes(load128(b + 4));
      break;
    case GgmlType::kQ5_0:
      out.d = half_to_float(b);
      out.m = 0.0f;
      std::memcpy(&qh, b + 2, 4);
      v = _mm256_sub_epi8(_mm256_or_si256(nibbles_to_bytes(load128(b + 6)), bits_to_bytes(qh, 16)), _mm256_set1_epi8(16));
      break;
    case GgmlType::kQ5_1:
      out.d = half_to_float(b);
      out.m = half_to_float(b + 2);
      std::memcpy(&qh, b + 4, 4);
      v = _mm256_or_si256(nibbles_to_bytes(load128(b + 8)), bits_to_bytes(qh, 16));
      break;
    case GgmlType::kIQ4_NL:
      out.d = half_to_float(b);
      out.m = 0.0f;
      v = iq4_lookup(nibbles_to_bytes(load128(b + 2)));
      break;
    default:
      return decode_block32(type, b, out);
  }
  _mm256_store_si256(reinterpret_cast<__m256i*>(out.v), v);
}

inline void store_v(DecodedSuper& out, int at, __m256i v) {
  _mm256_store_si256(reinterpret_cast<__m256i*>(out.v + at), v);
}

inline void decode_super_avx2(GgmlType type, const uint8_t* b, DecodedSuper& out) {
  out.non_negative = type == GgmlType::kQ2_K || type == GgmlType::kQ4_K || type == GgmlType::kQ5_K;
  const __m256i m2 = _mm256_set1_epi8(3);
  const __m256i m4 = _mm256_set1_epi8(15);
  switch (type) {
    case GgmlType::kQ2_K: {
      out.d = half_to_float(b + 80);
      out.dmin = half_to_float(b + 82);
      for (int s = 0; s < 16; ++s) {
        out.k[s] = static_cast<int16_t>(b[s] & 15);
        out.mn[s] = static_cast<int16_t>(b[s] >> 4);
      }
      for (int half = 0; half < 2; ++half) {
        const __m256i q = load256(b + 16 + 32 * half);
        for (int j = 0; j < 4; ++j) store_v(out, 128 * half + 32 * j, _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m2));
      }
      return;
    }
    case GgmlType::kQ3_K: {
      out.d = half_to_float(b + 108);
      out.dmin = 0.0f;
      for (int s = 0; s < 16; ++s) {
        out.k[s] = static_cast<int16_t>(q3_k_scale(s, b + 96));
        out.mn[s] = 0;
      }
      const __m256i hmask = load256(b);
      const __m256i four = _mm256_set1_epi8(4);
      for (int half = 0; half < 2; ++half) {
        const __m256i q = load256(b + 32 + 32 * half);
        for (int j = 0; j < 4; ++j) {
          const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << (4 * half + j)));
          const __m256i high = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hmask, bit), bit), four);
          const __m256i low = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m2);
          store_v(out, 128 * half + 32 * j, _mm256_sub_epi8(_mm256_add_epi8(low, high), four));
        }
      }
      return;
    }
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K: {
      const bool five = type == GgmlType::kQ5_K;
      out.d = half_to_float(b);
      out.dmin = half_to_float(b + 2);
      for (int j = 0; j < 8; ++j) {
        uint8_t sc, mn;
        k_scale_min(j, b + 4, &sc, &mn);
        out.k[2 * j] = out.k[2 * j + 1] = sc;
        out.mn[2 * j] = out.mn[2 * j + 1] = mn;
      }
      const uint8_t* qs = b + (five ? 48 : 16);
      const __m256i qh = five ? load256(b + 16) : _mm256_setzero_si256();
      const __m256i sixteen = _mm256_set1_epi8(16);
      for (int c = 0; c < 4; ++c) {
        const __m256i q = load256(qs + 32 * c);
        __m256i lo = _mm256_and_si256(q, m4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (five) {
          const __m256i bit_lo = _mm256_set1_epi8(static_cast<char>(1 << (2 * c)));
          const __m256i bit_hi = _mm256_set1_epi8(static_cast<char>(1 << (2 * c + 1)));
          lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit_lo), bit_lo), sixteen));
          hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit_hi), bit_hi), sixteen));
        }
        store_v(out, 64 * c, lo);
        store_v(out, 64 * c + 32, hi);
      }
      return;
    }
    case GgmlType::kQ6_K: {
      out.d = half_to_float(b + 208);
      out.dmin = 0.0f;
      for (int s = 0; s < 16; ++s) {
        out.k[s] = static_cast<int8_t>(b[192 + s]);
        out.mn[s] = 0;
      }
      const __m256i bias = _mm256_set1_epi8(32);
      for (int half = 0; half < 2; ++half) {
        const __m256i ql0 = load256(b + 64 * half);
        const __m256i ql1 = load256(b + 64 * half + 32);
        const __m256i qh = load256(b + 128 + 32 * half);
        auto high = [&](int shift) { return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, shift), m2), 4); };
        const int at = 128 * half;
        store_v(out, at, _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(ql0, m4), high(0)), bias));
        store_v(out, at + 32, _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(ql1, m4), high(2)), bias));
        store_v(out, at + 64,
                _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), high(4)), bias));
        store_v(out, at + 96,
                _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), high(6)), bias));
      }
      return;
    }
    case GgmlType::kIQ4_XS: {
      out.d = half_to_float(b);
      out.dmin = 0.0f;
      uint16_t scales_h;
      std::memcpy(&scales_h, b + 2, 2);
      for (int s = 0; s < 8; ++s) {
        const int ls = (((b[4 + s / 2] >> (4 * (s % 2))) & 15) | ((scales_h >> (2 * s)) & 3) << 4) - 32;
        out.k[2 * s] = out.k[2 * s + 1] = static_cast<int16_t>(ls);
        out.mn[2 * s] = out.mn[2 * s + 1] = 0;
      }
      for (int s = 0; s < 8; s += 2) {  // 32 bytes: sub-blocks s and s+1
        const __m256i q = load256(b + 8 + 16 * s);
        const __m256i lo = _mm256_and_si256(q, m4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        store_v(out, 32 * s, iq4_lookup(_mm256_permute2x128_si256(lo, hi, 0x20)));
        store_v(out, 32 * s + 32, iq4_lookup(_mm256_permute2x128_si256(lo, hi, 0x31)));
      }
      return;
    }
    default:
      return decode_super(type, b, out);
  }
}

}  // namespace
}  // namespace kvlm::ops_internal
