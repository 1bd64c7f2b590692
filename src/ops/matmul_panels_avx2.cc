// AVX2 GEMM for batches of quantized tokens (Q4_0 and IQ4_XS; Q8_0 batches enter here and go to
// the int16 pairs of matmul_wide_panels_avx2.cc, the K-quants to the integer-scaled panels of
// matmul_super_panels_avx2.cc):
// each thread stages its weight rows, one L2-sized block at a time, into 8-row panels of 4-bit
// codes, then runs every 3- or 4-token tile of the batch over each panel.
//
// Why 4-bit codes: without VNNI the integer dot is vpmaddubsw (u8 × s8 → pairs summed in
// int16) and vpmaddwd (int16 pairs → int32). With codes u ≤ 15 a pair is at most
// 2·15·127 = 3810, so the int16 results of a whole 32-column block (8 × 4 columns) add up in
// int16 without overflow (≤ 30480) and one vpmaddwd per block finishes them: per 4 columns ×
// 8 rows × 1 token, a vpmaddubsw and a vpaddsw. Q4_0's codes are such codes; IQ4_XS + 128
// (8 bits) becomes two planes, u = 16·h + l. No vpsignb is needed, which the usual
// |w|·sign(x, w) form spends on every product.
//
// Panel layout: a panel is 8 rows; in it, block b (32 columns) holds, for each plane, 8 quads
// of 32 bytes (quad k: row 0's columns 4k..4k+3, row 1's, ... row 7's), then the 8 rows' f32
// scales. A token's 4 activation bytes of quad k are broadcast to all 8 rows, so each int32 lane
// of the result is one row: after a block, one vcvtdq2ps and one FMA scale 8 rows.
// Rows past the matrix are zero codes with scale 0, never stored.
//
// Per element, over blocks b: Σ_b d_w·d_x·(Σ_{e in b} u·q − offset·Σ_{e in b} q), the inner sums
// exact in int32. Blocks are accumulated in order in f32, so the result does not depend on the
// tile or on how rows are split over threads. Activations are the 32-element blocks of
// QuantizedActivations.
#include <immintrin.h>

#include <cstring>
#include <vector>

#include "core/check.h"
#include "ops/matmul_kernels.h"
#include "ops/matmul_panel_driver_avx2.h"
#include "ops/matmul_super_decode_avx2.h"
#include "ops/transpose_avx2.h"

namespace kvlm::ops_internal {
namespace {

using avx2_panels::kPanelRows;
constexpr int kQuads = 8;  // 4-column groups of a 32-column block
constexpr int kPlaneBytes = 32 * kQuads;

// Staging prefetches each row this many bytes ahead.
constexpr int64_t kPrefetchBytes = 512;

// How a weight type's values become panel codes u with an f32 scale per 32-element block:
//   value = scale·(u − 2^kOffsetShift)  (the integer offset taken out in int32).
// Codes of more than 4 bits are split into planes of 4 (u = l + 16·h). Types staged by
// stage_panels decode one unit of a row (a 32-element block, or a 256-element super-block of 8
// blocks) into kUnitBlocks × 32 code bytes in column order and a scale per block.
struct PanelQ4_0 {  // staged by stage_panels<PanelQ4_0>
  static constexpr int kPlanes = 1;
  static constexpr int kOffsetShift = 3;  // nibbles stored + 8
};

// IQ4_XS through its register decoder (matmul_super_decode_avx2.h): d·k of each 32-element
// block is its scale, and its signed grid values move up by 128 (two planes). The K-quants go to
// matmul_super_panels_avx2.cc (integer sub-block scales on super-block activations).
struct PanelIq4Xs {
  using Super = SuperIq4Xs;
  static constexpr int kPlanes = 2;
  static constexpr int kOffsetShift = 7;  // v + 128
  static constexpr int kUnitBlocks = 8;
  static constexpr int64_t kUnitBytes = Super::kBytes;
  static void decode(const uint8_t* unit, __m256i* codes, float* scales) {
    const SuperScales s = Super::scales(unit);
    alignas(32) int16_t k[16];  // per 16-element sub-block: lanes 2j and 2j + 1 are block j's
    _mm256_store_si256(reinterpret_cast<__m256i*>(k), s.k16);
    for (int j = 0; j < kUnitBlocks; ++j) scales[j] = s.d * k[2 * j];
    Super::template values<0>(unit, codes[0], codes[1]);
    Super::template values<1>(unit, codes[2], codes[3]);
    Super::template values<2>(unit, codes[4], codes[5]);
    Super::template values<3>(unit, codes[6], codes[7]);
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    for (int j = 0; j < kUnitBlocks; ++j) codes[j] = _mm256_xor_si256(codes[j], flip);
  }
};

// Splits 8-bit codes into two 4-bit planes, u = l + 16·h.
inline void split_planes(__m256i u, __m256i (&planes)[2]) {
  const __m256i nibble = _mm256_set1_epi8(0x0f);
  planes[0] = _mm256_and_si256(u, nibble);
  planes[1] = _mm256_and_si256(_mm256_srli_epi16(u, 4), nibble);
}

template <class Codes>
constexpr int64_t scales_offset() {
  return Codes::kPlanes * kPlaneBytes;
}
template <class Codes>
constexpr int64_t staged_block_bytes() {
  return scales_offset<Codes>() + kPanelRows * 4;
}

// Stages rows [r0, row_end) into num_panels panels (the rows past row_end as zeros). Each
// unit of 8 rows is decoded, and each block transposed as 4-byte groups (an 8 × 8 dword
// transpose), then split into planes. Q4_0 (one plane) has its own specialization below.
template <class Codes>
void stage_panels(const WeightMatrix& w, int64_t r0, int64_t row_end, int64_t num_panels, uint8_t* out) {
  constexpr int kPlanes = Codes::kPlanes;
  static_assert(kPlanes == 2, "one-plane types decode after their transpose (stage_panels<PanelQ4_0>)");
  constexpr int kUnitBlocks = Codes::kUnitBlocks;
  const int64_t num_blocks = w.cols / 32;
  const int64_t block_bytes = staged_block_bytes<Codes>();
  for (int64_t panel = 0; panel < num_panels; ++panel) {
    uint8_t* panel_out = out + panel * num_blocks * block_bytes;
    const uint8_t* src[kPanelRows];
    avx2_panels::panel_rows(w, r0, row_end, panel, src);
    for (int64_t unit = 0; unit < num_blocks / kUnitBlocks; ++unit) {
      __m256i codes[kPanelRows][kUnitBlocks];
      alignas(32) float scales[kUnitBlocks][kPanelRows];
      for (int i = 0; i < kPanelRows; ++i) {
        alignas(32) float row_scales[kUnitBlocks] = {};
        if (src[i] != nullptr) {
          // The hardware prefetcher alone follows 8 row streams at half the DRAM bandwidth.
          const uint8_t* ahead = src[i] + unit * Codes::kUnitBytes + kPrefetchBytes;
          for (int64_t line = 0; line < Codes::kUnitBytes; line += 64) {
            _mm_prefetch(reinterpret_cast<const char*>(ahead + line), _MM_HINT_T0);
          }
          Codes::decode(src[i] + unit * Codes::kUnitBytes, codes[i], row_scales);
        } else {
          for (int j = 0; j < kUnitBlocks; ++j) codes[i][j] = _mm256_setzero_si256();  // zero codes and scale
        }
        for (int j = 0; j < kUnitBlocks; ++j) scales[j][i] = row_scales[j];
      }
      for (int j = 0; j < kUnitBlocks; ++j) {
        uint8_t* dst = panel_out + (unit * kUnitBlocks + j) * block_bytes;
        __m256i block[kPanelRows];
        for (int i = 0; i < kPanelRows; ++i) block[i] = codes[i][j];
        transpose_8x8_dwords(block);
        for (int k = 0; k < kQuads; ++k) {
          __m256i planes[kPlanes];
          split_planes(block[k], planes);
          for (int p = 0; p < kPlanes; ++p) {
            _mm256_store_si256(reinterpret_cast<__m256i*>(dst + p * kPlaneBytes + k * 32), planes[p]);
          }
        }
        _mm256_store_ps(reinterpret_cast<float*>(dst + scales_offset<Codes>()), _mm256_load_ps(scales[j]));
      }
    }
  }
}

// Q4_0's staging: each row's packed bytes of two blocks side by side in a register, dword
// transposed before they are split into nibbles. Vector m < 4 then holds bytes 4m..4m + 3 of
// the first block of every row and vector 4 + m those of the second; a byte's low nibble is
// column 4m + l, its high nibble column 16 + 4m + l. One transpose per two blocks (decoding
// first took one per block), and the scales go through one conversion per block.
template <>
void stage_panels<PanelQ4_0>(const WeightMatrix& w, int64_t r0, int64_t row_end, int64_t num_panels, uint8_t* out) {
  const int64_t num_blocks = w.cols / 32;
  const int64_t block_bytes = staged_block_bytes<PanelQ4_0>();
  const __m256i nibble = _mm256_set1_epi8(0x0f);
  constexpr int64_t kBytes = sizeof(BlockQ4_0);
  for (int64_t panel = 0; panel < num_panels; ++panel) {
    uint8_t* panel_out = out + panel * num_blocks * block_bytes;
    const uint8_t* src[kPanelRows];
    avx2_panels::panel_rows(w, r0, row_end, panel, src);
    for (int64_t b = 0; b < num_blocks; b += 2) {
      const int count = b + 1 < num_blocks ? 2 : 1;
      __m256i packed[kPanelRows];
      alignas(16) uint16_t halves[2][kPanelRows] = {};  // f16 zero for rows past the matrix
      for (int i = 0; i < kPanelRows; ++i) {
        if (src[i] == nullptr) {
          packed[i] = _mm256_setzero_si256();
          continue;
        }
        const uint8_t* block = src[i] + b * kBytes;
        // The hardware prefetcher alone follows 8 row streams at half the DRAM bandwidth.
        _mm_prefetch(reinterpret_cast<const char*>(block + kPrefetchBytes), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(block + kPrefetchBytes + 2 * kBytes - 1), _MM_HINT_T0);
        const __m128i first = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2));
        const __m128i second =
            count == 2 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + kBytes + 2)) : _mm_setzero_si128();
        packed[i] = _mm256_set_m128i(second, first);
        std::memcpy(&halves[0][i], block, 2);
        if (count == 2) std::memcpy(&halves[1][i], block + kBytes, 2);
      }
      transpose_8x8_dwords(packed);
      for (int h = 0; h < count; ++h) {
        uint8_t* dst = panel_out + (b + h) * block_bytes;
        for (int m = 0; m < 4; ++m) {
          const __m256i bytes = packed[4 * h + m];
          _mm256_store_si256(reinterpret_cast<__m256i*>(dst + m * 32), _mm256_and_si256(bytes, nibble));
          _mm256_store_si256(reinterpret_cast<__m256i*>(dst + (m + 4) * 32),
                             _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble));
        }
        _mm256_store_ps(reinterpret_cast<float*>(dst + scales_offset<PanelQ4_0>()),
                        _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(halves[h]))));
      }
    }
  }
}

// Σ q of each block of the tokens [token_begin, token_end) of xq as int32, [tokens, blocks]: the
// same for every row.
void activation_block_sums(const QuantizedActivations& xq, int64_t token_begin, int64_t token_end, int32_t* out) {
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t t = token_begin; t < token_end; ++t) {
    for (int64_t b = 0; b < xq.num_blocks; ++b) {
      const int64_t block = t * xq.num_blocks + b;
      // vpsadbw sums unsigned bytes per 8: q + 128 summed, 128 per byte taken back out.
      const __m256i sad = _mm256_sad_epu8(
          _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq.qs + block * 32)), flip),
          _mm256_setzero_si256());
      alignas(32) int64_t eights[4];
      _mm256_store_si256(reinterpret_cast<__m256i*>(eights), sad);
      out[(t - token_begin) * xq.num_blocks + b] =
          static_cast<int32_t>(eights[0] + eights[1] + eights[2] + eights[3]) - 32 * 128;
    }
  }
}

// One panel × T tokens over every block; y rows [r0, r0 + valid_rows) of each token.
// block_sums: activation_block_sums of the call's tokens, from token sums_begin.
template <class Codes, int T>
void panel_tile(const uint8_t* panel, const QuantizedActivations& xq, const int32_t* block_sums, int64_t sums_begin,
                int64_t t0, float* y, int64_t y_stride, int64_t r0, int valid_rows,
                avx2_panels::NextStagePrefetch& prefetch) {
  constexpr int kPlanes = Codes::kPlanes;
  const int64_t num_blocks = xq.num_blocks;
  const int64_t block_bytes = staged_block_bytes<Codes>();
  const int8_t* qs[T];
  const float* scales[T];
  const int32_t* sums[T];
  for (int t = 0; t < T; ++t) {
    qs[t] = xq.qs + (t0 + t) * num_blocks * 32;
    scales[t] = xq.scales + (t0 + t) * num_blocks;
    sums[t] = block_sums + (t0 + t - sums_begin) * num_blocks;
  }
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i sixteen = _mm256_set1_epi16(16);
  __m256 acc[T];
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < num_blocks; ++b) {
    prefetch.step();
    const uint8_t* block = panel + b * block_bytes;
    __m256i low[T];
    __m256i high[T];
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      low[t] = _mm256_setzero_si256();
      high[t] = _mm256_setzero_si256();
    }
    // Fully unrolled, and summed with vpaddsw, which never saturates here (the sums stay
    // within ±30480) but, unlike vpaddw, is not associative to the compiler: with vpaddw GCC
    // regrouped the unrolled chain into a tree of all 8 quads' products, which spilled them
    // to the stack (and with 4-quad unrolling kept the tiles' accumulators in memory).
    // Measured (2048² × 512 tokens, one thread, Zen 3, old/new in one process,
    // interleaved): Q4_0 1.51×, Q4_K 1.20-1.30×, Q2_K 1.14×, Q3_K 1.14×, Q5_K 1.12×,
    // IQ4_XS 1.12×, Q6_K 1.0×; the same results.
#pragma GCC unroll 8
    for (int k = 0; k < kQuads; ++k) {
      const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(block + k * 32));
      __m256i w1 = _mm256_setzero_si256();
      if constexpr (kPlanes == 2) {
        w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(block + kPlaneBytes + k * 32));
      }
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        const __m256i xb = _mm256_set1_epi32(
            static_cast<int32_t>(super_decode::load_u32(reinterpret_cast<const uint8_t*>(qs[t] + b * 32 + 4 * k))));
        low[t] = _mm256_adds_epi16(low[t], _mm256_maddubs_epi16(w0, xb));
        if constexpr (kPlanes == 2) high[t] = _mm256_adds_epi16(high[t], _mm256_maddubs_epi16(w1, xb));
      }
    }
    const __m256 wd = _mm256_load_ps(reinterpret_cast<const float*>(block + scales_offset<Codes>()));
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      __m256i dot = _mm256_madd_epi16(low[t], ones);
      if constexpr (kPlanes == 2) dot = _mm256_add_epi32(dot, _mm256_madd_epi16(high[t], sixteen));
      // Sums are broadcast from memory (a load, no shuffle port).
      const __m256i sum = _mm256_castps_si256(_mm256_broadcast_ss(reinterpret_cast<const float*>(sums[t] + b)));
      dot = _mm256_sub_epi32(dot, _mm256_slli_epi32(sum, Codes::kOffsetShift));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(wd, _mm256_set1_ps(scales[t][b])), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) avx2_panels::store_panel_rows(acc[t], y + (t0 + t) * y_stride + r0, valid_rows);
}

template <class Codes>
void run_panels(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  constexpr int kTokens = Codes::kPlanes == 2 ? 3 : 4;  // 16 ymm: T·(planes + 2) accumulators at most
  const WeightMatrix& w = *p.w;
  const QuantizedActivations& xq = *p.xq;
  const int64_t num_blocks = w.cols / 32;
  thread_local std::vector<int32_t> block_sums;
  block_sums.resize(static_cast<size_t>((p.token_end - p.token_begin) * num_blocks));
  activation_block_sums(xq, p.token_begin, p.token_end, block_sums.data());
  avx2_panels::run_staged_panels<kTokens>(
      p, row_begin, row_end, num_blocks * staged_block_bytes<Codes>(),
      QuantizedActivations::bytes_per_token(num_blocks), num_blocks,
      [&](int64_t r0, int64_t stage_end, int64_t num_panels, uint8_t* out) {
        stage_panels<Codes>(w, r0, stage_end, num_panels, out);
      },
      [&](auto tokens, const uint8_t* panel, int64_t t, int64_t panel_r0, int valid,
          avx2_panels::NextStagePrefetch& prefetch) {
        panel_tile<Codes, decltype(tokens)::value>(panel, xq, block_sums.data(), p.token_begin, t, p.y, w.rows,
                                                   panel_r0, valid, prefetch);
      });
}

}  // namespace

bool avx2_panels_support(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
    case GgmlType::kIQ4_XS:
      return true;
    default:
      return false;
  }
}

void matmul_panels_avx2(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  count_isa_kernel_run(Isa::kAvx2);
  count_avx2_panel_kernel_run();
  if (avx2_super_panels_support(p.w->type)) return matmul_super_panels_avx2(p, row_begin, row_end);  // on p.xk
  switch (p.w->type) {
    case GgmlType::kQ8_0:
      return matmul_wide_panels_avx2(p, row_begin, row_end);  // int16 pairs, not code planes
    case GgmlType::kQ4_0:
      return run_panels<PanelQ4_0>(p, row_begin, row_end);
    case GgmlType::kIQ4_XS:
      return run_panels<PanelIq4Xs>(p, row_begin, row_end);
    default:
      KVLM_CHECK(false, "matmul_panels_avx2: weight type {}", ggml_type_name(p.w->type));
  }
}

}  // namespace kvlm::ops_internal
