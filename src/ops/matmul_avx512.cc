// AVX-512 matmul kernels (F/BW/VL/DQ + VNNI), one token or a few at a time: register tiles
// of up to kRows weight rows × kTokens tokens, so each weight vector loaded serves every token
// of the tile, with software prefetch a few rows ahead so decode streams at DRAM bandwidth.
// Batches of quantized weights go to matmul_groups_avx512.cc instead.
// GCC 12's AVX-512 intrinsic headers seed results with _mm*_undefined_*(), which its own
// uninitialized-use warnings flag at every call site (GCC bug 105593); the code is fine.
#if !defined(__clang__)  // clang has no -Wmaybe-uninitialized
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "ops/matmul_kernels.h"

namespace kvlm::ops_internal {
namespace {

// 4 × 4 tiles: 16 accumulators plus the tile's weight vectors and scales fit in 32 registers.
constexpr int kRows = 4;
constexpr int kTokens = 4;
// Weights are prefetched this many rows ahead of the tile: measured on the 2-vCPU Zen 5 VM,
// the hardware prefetcher alone left single-thread decode at 60-75% of DRAM bandwidth.
constexpr int64_t kPrefetchRows = 8;

// ---- F32 / F16 / BF16: 16 columns per step, converted in registers, FMA with f32 x. ----

struct F32Row {
  static constexpr int kBytes = 4;
  static __m512 load(const uint8_t* row, int64_t c) { return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + c); }
  static __m512 load_masked(const uint8_t* row, int64_t c, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(row) + c);
  }
};

struct F16Row {
  static constexpr int kBytes = 2;
  static __m512 load(const uint8_t* row, int64_t c) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * c)));
  }
  static __m512 load_masked(const uint8_t* row, int64_t c, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * c));
  }
};

// bf16 is the upper half of an f32: widen and shift.
struct Bf16Row {
  static constexpr int kBytes = 2;
  static __m512 widen(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
  static __m512 load(const uint8_t* row, int64_t c) {
    return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * c)));
  }
  static __m512 load_masked(const uint8_t* row, int64_t c, __mmask16 m) {
    return widen(_mm256_maskz_loadu_epi16(m, row + 2 * c));
  }
};

template <class Row>
struct FloatKernel {
  template <int R, int T>
  static void tile(const MatmulProblem& p, int64_t r0, int64_t t0) {
    const WeightMatrix& w = *p.w;
    const uint8_t* rows[R];
    const float* xs[T];
    for (int r = 0; r < R; ++r) rows[r] = w.data + static_cast<uint64_t>(r0 + r) * w.row_bytes;
    for (int t = 0; t < T; ++t) xs[t] = p.x + (t0 + t) * w.cols;
    __m512 acc[R][T];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
    }
    const int64_t ahead = kPrefetchRows * static_cast<int64_t>(w.row_bytes);
    int64_t c = 0;
    for (; c + 16 <= w.cols; c += 16) {
      __m512 wv[R];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(rows[r] + ahead + c * Row::kBytes), _MM_HINT_T0);
        wv[r] = Row::load(rows[r], c);
      }
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) {
        const __m512 xv = _mm512_loadu_ps(xs[t] + c);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
      }
    }
    if (c < w.cols) {  // masked loads never touch the bytes past the row
      const __mmask16 m = static_cast<__mmask16>((1u << (w.cols - c)) - 1);
      __m512 wv[R];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) wv[r] = Row::load_masked(rows[r], c, m);
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) {
        const __m512 xv = _mm512_maskz_loadu_ps(m, xs[t] + c);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
      }
    }
    for (int t = 0; t < T; ++t) {
      for (int r = 0; r < R; ++r) p.y[(t0 + t) * w.rows + r0 + r] = _mm512_reduce_add_ps(acc[r][t]);
    }
  }
};

// ---- Q8_0 / Q4_0: integer dots with vpdpbusd, scaled per block in f32. ----
//
// vpdpbusd multiplies unsigned by signed bytes, so weights enter as unsigned (Q8_0 + 128,
// Q4_0 nibbles as stored) and the activation bias lanes (activation_bias_offset) take the
// offset back out. Each int32 lane sums 4 products of one block; after the integer dots of
// a step, lanes are converted and scaled by d_w·d_x of their block.

// Q8_0, two blocks per step: lanes 0-7 are block b, lanes 8-15 block b+1. kValid is 1 only
// for the last block of an odd count, which fills the lower half (zeros above).
// The f16 scales (words 0 and 17 of the pair) come out of one 64-byte load with vpermw.
struct Q8_0Steps {
  static constexpr int64_t kBlockBytes = sizeof(BlockQ8_0);
  static constexpr int kBlocksPerStep = 2;

  // One token's activations, used as quantized.
  struct Token {
    const int8_t* qs;     // [num_blocks, 32]
    const float* scales;  // [num_blocks]
    const int32_t* bias;  // [num_blocks, 8]
  };
  struct Context {
    const QuantizedActivations* xq;
    Token token(int64_t t) const {
      return Token{xq->qs + t * xq->num_blocks * 32, xq->scales + t * xq->num_blocks,
                   xq->bias + t * xq->num_blocks * 8};
    }
  };

  template <int kValid>
  static void load_blocks(const uint8_t* block, __m512i& q, __m512& d) {
    alignas(64) static constexpr int16_t kScaleWords[32] = {0, 0, 0, 0, 0, 0, 0, 0, 17, 17, 17, 17, 17, 17, 17, 17};
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2));
    const __m256i hi = kValid == 2 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kBlockBytes + 2))
                                   : _mm256_setzero_si256();
    q = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), _mm512_set1_epi8(-128));
    const __m512i head = _mm512_maskz_loadu_epi8(kValid == 2 ? ~__mmask64{0} : __mmask64{(1ull << 34) - 1}, block);
    d = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(_mm512_load_si512(kScaleWords), head)));
    if (kValid == 1) d = _mm512_maskz_mov_ps(0x00ff, d);
  }

  template <int kValid, int R, int T>
  [[gnu::always_inline]] static inline void step(const uint8_t* const* rows, const Token* tokens, int64_t b,
                                                 __m512 (&acc)[R][T], int64_t ahead) {
    const __m512i pair_lanes = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    __m512i wq[R];
    __m512 wd[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(rows[r] + ahead + b * kBlockBytes), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(rows[r] + ahead + b * kBlockBytes + 64), _MM_HINT_T0);
      load_blocks<kValid>(rows[r] + b * kBlockBytes, wq[r], wd[r]);
    }
    const __mmask64 x_mask = kValid == 2 ? ~__mmask64{0} : __mmask64{0xffffffff};
    const __mmask16 lane_mask = kValid == 2 ? 0xffff : 0x00ff;
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const __m512i xv = _mm512_maskz_loadu_epi8(x_mask, tokens[t].qs + b * 32);
      const __m512i xb = _mm512_maskz_loadu_epi32(lane_mask, tokens[t].bias + b * 8);
      const __m512 xd = _mm512_permutexvar_ps(
          pair_lanes, _mm512_castps128_ps512(_mm_maskz_loadu_ps(kValid == 2 ? 0x3 : 0x1, tokens[t].scales + b)));
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const __m512i dot = _mm512_dpbusd_epi32(xb, wq[r], xv);
        acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(wd[r], xd), acc[r][t]);
      }
    }
  }
};

// Q4_0, four blocks per step. Byte i of a block holds element i (low nibble) and i+16 (high
// nibble), so [qs0 qs1 qs2 qs3] gives the first halves of four blocks in its low nibbles and
// the second halves in its high nibbles; the activations are regrouped to match (once per
// call, see Quad), and both vpdpbusd land in one accumulator whose lanes 4j..4j+3 belong to
// block b+j. The four blocks (72 bytes) come in one 64-byte load plus the 8 bytes after it;
// vpermw picks the quants (words 1-8, 10-17, 19-26, 28-35) and the scales (words 0, 9, 18,
// 27). kValid < 4 only for the last step of a row; the missing blocks are zeros.
struct Q4_0Steps {
  static constexpr int64_t kBlockBytes = sizeof(BlockQ4_0);
  static constexpr int kBlocksPerStep = 4;

  // The activation side of one step of one token, the same for every weight row: formed once
  // per call instead of once per row, which matters most for decode.
  struct Quad {
    __m512i lo;    // first halves of blocks b..b+3
    __m512i hi;    // second halves
    __m512i bias;  // lane bias of both halves
    __m512 scale;  // d_x of each lane's block
  };
  struct Token {
    const Quad* quads;  // [num_blocks / 4 rounded up]
  };
  struct Context {
    const Quad* quads;  // [tokens of the call, quads per token]
    int64_t token_begin;
    int64_t quads_per_token;
    Token token(int64_t t) const { return Token{quads + (t - token_begin) * quads_per_token}; }
  };

  static Context prepare(const QuantizedActivations& xq, int64_t token_begin, int64_t token_end,
                         std::vector<Quad>& storage) {
    const int64_t quads_per_token = (xq.num_blocks + kBlocksPerStep - 1) / kBlocksPerStep;
    storage.resize(static_cast<size_t>((token_end - token_begin) * quads_per_token));
    const __m512i quad_lanes = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    for (int64_t t = token_begin; t < token_end; ++t) {
      const int8_t* qs = xq.qs + t * xq.num_blocks * 32;
      const int32_t* bias = xq.bias + t * xq.num_blocks * 8;
      const float* scales = xq.scales + t * xq.num_blocks;
      for (int64_t k = 0; k < quads_per_token; ++k) {
        const int64_t b = k * kBlocksPerStep;
        const int64_t valid = std::min<int64_t>(4, xq.num_blocks - b);
        // [b, b+1] and [b+2, b+3] as stored, regrouped into first halves and second halves.
        const __mmask64 mask_a = valid >= 2 ? ~__mmask64{0} : __mmask64{0xffffffff};
        const __mmask64 mask_b = valid == 4 ? ~__mmask64{0} : valid == 3 ? __mmask64{0xffffffff} : __mmask64{0};
        const __m512i xa = _mm512_maskz_loadu_epi8(mask_a, qs + b * 32);
        const __m512i xb = _mm512_maskz_loadu_epi8(mask_b, qs + b * 32 + 64);
        const __mmask16 lanes_a = valid >= 2 ? 0xffff : 0x00ff;
        const __mmask16 lanes_b = valid == 4 ? 0xffff : valid == 3 ? 0x00ff : 0;
        const __m512i ba = _mm512_maskz_loadu_epi32(lanes_a, bias + b * 8);
        const __m512i bb = _mm512_maskz_loadu_epi32(lanes_b, bias + b * 8 + 16);
        Quad& quad = storage[static_cast<size_t>((t - token_begin) * quads_per_token + k)];
        quad.lo = _mm512_shuffle_i64x2(xa, xb, _MM_SHUFFLE(2, 0, 2, 0));
        quad.hi = _mm512_shuffle_i64x2(xa, xb, _MM_SHUFFLE(3, 1, 3, 1));
        quad.bias = _mm512_add_epi32(_mm512_shuffle_i64x2(ba, bb, _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_i64x2(ba, bb, _MM_SHUFFLE(3, 1, 3, 1)));
        const __mmask8 scale_mask = static_cast<__mmask8>((1u << valid) - 1);
        quad.scale =
            _mm512_permutexvar_ps(quad_lanes, _mm512_castps128_ps512(_mm_maskz_loadu_ps(scale_mask, scales + b)));
      }
    }
    return Context{storage.data(), token_begin, quads_per_token};
  }

  template <int kValid>
  static void load_blocks(const uint8_t* block, __m512i& packed, __m512& d) {
    alignas(64) static constexpr int16_t kQuantWords[32] = {1,  2,  3,  4,  5,  6,  7,  8,  10, 11, 12,
                                                            13, 14, 15, 16, 17, 19, 20, 21, 22, 23, 24,
                                                            25, 26, 28, 29, 30, 31, 32, 33, 34, 35};
    alignas(64) static constexpr int16_t kScaleWords[32] = {0, 0, 0, 0, 9, 9, 9, 9, 18, 18, 18, 18, 27, 27, 27, 27};
    constexpr int kBytes = kValid * static_cast<int>(kBlockBytes);
    const __mmask64 head_mask = kBytes >= 64 ? ~__mmask64{0} : __mmask64{(1ull << kBytes) - 1};
    const __mmask64 tail_mask = kBytes > 64 ? __mmask64{(1ull << (kBytes - 64)) - 1} : __mmask64{0};
    const __m512i head = _mm512_maskz_loadu_epi8(head_mask, block);
    const __m512i tail = _mm512_maskz_loadu_epi8(tail_mask, block + 64);
    const __mmask32 valid_words = kValid == 4 ? ~__mmask32{0} : static_cast<__mmask32>((1ull << (8 * kValid)) - 1);
    packed = _mm512_maskz_permutex2var_epi16(valid_words, head, _mm512_load_si512(kQuantWords), tail);
    d = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(_mm512_load_si512(kScaleWords), head)));
    if (kValid < 4) d = _mm512_maskz_mov_ps(static_cast<__mmask16>((1u << (4 * kValid)) - 1), d);
  }

  template <int kValid, int R, int T>
  [[gnu::always_inline]] static inline void step(const uint8_t* const* rows, const Token* tokens, int64_t b,
                                                 __m512 (&acc)[R][T], int64_t ahead) {
    const __m512i low_nibbles = _mm512_set1_epi8(0x0f);
    __m512i wlo[R];
    __m512i whi[R];
    __m512 wd[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      __m512i packed;
      _mm_prefetch(reinterpret_cast<const char*>(rows[r] + ahead + b * kBlockBytes), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(rows[r] + ahead + b * kBlockBytes + 64), _MM_HINT_T0);
      load_blocks<kValid>(rows[r] + b * kBlockBytes, packed, wd[r]);
      wlo[r] = _mm512_and_si512(packed, low_nibbles);
      whi[r] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low_nibbles);
    }
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const Quad& quad = tokens[t].quads[b / kBlocksPerStep];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const __m512i dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(quad.bias, wlo[r], quad.lo), whi[r], quad.hi);
        acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(wd[r], quad.scale), acc[r][t]);
      }
    }
  }
};

template <class Steps>
struct QuantKernel {
  template <int R, int T>
  static void tile(const MatmulProblem& p, int64_t r0, int64_t t0, const typename Steps::Context& context) {
    constexpr int kStep = Steps::kBlocksPerStep;
    const WeightMatrix& w = *p.w;
    const int64_t num_blocks = p.xq->num_blocks;
    const uint8_t* rows[R];
    typename Steps::Token tokens[T];
    for (int r = 0; r < R; ++r) rows[r] = w.data + static_cast<uint64_t>(r0 + r) * w.row_bytes;
    for (int t = 0; t < T; ++t) tokens[t] = context.token(t0 + t);
    __m512 acc[R][T];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
    }
    const int64_t ahead = kPrefetchRows * static_cast<int64_t>(w.row_bytes);
    int64_t b = 0;
    for (; b + kStep <= num_blocks; b += kStep) Steps::template step<kStep>(rows, tokens, b, acc, ahead);
    switch (num_blocks - b) {  // the last blocks of a row, fewer than a step
      case 3:
        if constexpr (kStep > 3) Steps::template step<3>(rows, tokens, b, acc, ahead);
        break;
      case 2:
        if constexpr (kStep > 2) Steps::template step<2>(rows, tokens, b, acc, ahead);
        break;
      case 1:
        Steps::template step<1>(rows, tokens, b, acc, ahead);
        break;
      default:
        break;
    }
    for (int t = 0; t < T; ++t) {
      for (int r = 0; r < R; ++r) p.y[(t0 + t) * w.rows + r0 + r] = _mm512_reduce_add_ps(acc[r][t]);
    }
  }
};

// Full R × T tiles where they fit; leftover rows and tokens run 1-wide tiles, which compute
// each element with exactly the same operations. `context` goes to every tile.
template <class Kernel, int R, int T, class... Context>
void run_tiles(const MatmulProblem& p, int64_t row_begin, int64_t row_end, const Context&... context) {
  int64_t r = row_begin;
  for (; r + R <= row_end; r += R) {
    int64_t t = p.token_begin;
    for (; t + T <= p.token_end; t += T) Kernel::template tile<R, T>(p, r, t, context...);
    for (; t < p.token_end; ++t) Kernel::template tile<R, 1>(p, r, t, context...);
  }
  for (; r < row_end; ++r) {
    int64_t t = p.token_begin;
    for (; t + T <= p.token_end; t += T) Kernel::template tile<1, T>(p, r, t, context...);
    for (; t < p.token_end; ++t) Kernel::template tile<1, 1>(p, r, t, context...);
  }
}

// With few tokens the quantized kernels are bound by streaming the weights, which goes
// fastest one row at a time (a single sequential stream); batches share loads in 4 × 4 tiles.
template <class Steps>
void run_quant_tiles(const MatmulProblem& p, int64_t row_begin, int64_t row_end,
                     const typename Steps::Context& context) {
  if (p.token_end - p.token_begin < kTokens) {
    return run_tiles<QuantKernel<Steps>, 1, 1>(p, row_begin, row_end, context);
  }
  run_tiles<QuantKernel<Steps>, kRows, kTokens>(p, row_begin, row_end, context);
}

}  // namespace

void quantize_activations_avx512(const float* x, int64_t cols, int64_t token_begin, int64_t token_end,
                                 int32_t bias_offset, const QuantizedActivations& out) {
  const int64_t num_blocks = cols / 32;
  const __m256i ones = _mm256_set1_epi8(1);
  const __m256i neg_offset = _mm256_set1_epi32(-bias_offset);
  for (int64_t t = token_begin; t < token_end; ++t) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const float* xb = x + t * cols + b * 32;
      const int64_t block_idx = t * num_blocks + b;
      const __m512 v0 = _mm512_loadu_ps(xb);
      const __m512 v1 = _mm512_loadu_ps(xb + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
      // Same scalar formulas as the portable quantizer, so the results are bit-identical.
      const float d = amax / 127.0f;
      const float inv_d = amax != 0.0f ? 127.0f / amax : 0.0f;
      const __m512 inv = _mm512_set1_ps(inv_d);
      const __m128i q0 = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v0, inv)));
      const __m128i q1 = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v1, inv)));
      const __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(q0), q1, 1);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.qs + block_idx * 32), q);
      out.scales[block_idx] = d;
      if (bias_offset != 0) {
        const __m256i lane_sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, q);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.bias + block_idx * 8),
                            _mm256_mullo_epi32(lane_sums, neg_offset));
      }
    }
  }
}

void matmul_rows_avx512(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  count_isa_kernel_run(Isa::kAvx512);
  switch (p.w->type) {
    case GgmlType::kF32:
      return run_tiles<FloatKernel<F32Row>, kRows, kTokens>(p, row_begin, row_end);
    case GgmlType::kF16:
      return run_tiles<FloatKernel<F16Row>, kRows, kTokens>(p, row_begin, row_end);
    case GgmlType::kBF16:
      return run_tiles<FloatKernel<Bf16Row>, kRows, kTokens>(p, row_begin, row_end);
    case GgmlType::kQ8_0:
      return run_quant_tiles<Q8_0Steps>(p, row_begin, row_end, Q8_0Steps::Context{p.xq});
    case GgmlType::kQ4_0: {
      thread_local std::vector<Q4_0Steps::Quad> quads;
      return run_quant_tiles<Q4_0Steps>(p, row_begin, row_end,
                                        Q4_0Steps::prepare(*p.xq, p.token_begin, p.token_end, quads));
    }
    default:
      KVLM_CHECK(false, "matmul_rows_avx512: weight type {}", ggml_type_name(p.w->type));
  }
}

}  // namespace kvlm::ops_internal
