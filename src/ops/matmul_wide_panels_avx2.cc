// AVX2 GEMM for batches of Q8_0 tokens: weights staged as int16 pairs, the dot by vpmaddwd.
//
// Why not the 4-bit code panels of matmul_panels_avx2.cc: there an 8-bit weight becomes two
// planes of codes, and every 4 columns × 8 rows × 1 token cost two vpmaddubsw and two vpaddw,
// plus per block two vpmaddwd, the planes' combination and the w + 128 offset. Sign-extended
// to int16 a weight takes one vpmaddwd (2 columns × 8 rows, exact int32 pair sums) and one
// vpaddd per 2 columns: the same 4 ALU ops per 4 columns, and per block only the float steps.
// The broadcast of a token's pair is a load, which takes no ALU port.
//
// Panel layout: 8 rows; block b (32 columns) holds 16 vectors, vector j the int16 pair of
// columns 2j, 2j + 1 of rows 0..7, then the 8 rows' f32 scales: 544 bytes, as many as the two
// code planes it replaces. Activations are QuantizedActivations' int8 q, sign-extended to int16
// once per call (MatmulProblem::x16). Tiles are 2 panels (16 rows) × 3 tokens, so each broadcast
// serves two vpmaddwd; 6 int32 and 6 f32 accumulators, 2 weight vectors and the broadcast take
// the 16 ymm registers.
//
// Blocking: each thread stages its rows, an L2-sized block of rows × a slice of at most
// kSliceBlocks blocks at a time, and runs every token over it, a chunk of tokens (held in L2
// beside the rows) at a time. A slice after the first starts from the y that the slices before
// it left, so every output is Σ_b d_w·d_x·(Σ w·q) accumulated block by block in order, as in the
// code panels: the two kernels' results are the same bits.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/check.h"
#include "ops/matmul_kernels.h"
#include "ops/matmul_panel_driver_avx2.h"
#include "ops/matmul_super_decode_avx2.h"

namespace kvlm::ops_internal {
namespace {

using avx2_panels::kPanelRows;
constexpr int kPairs = 16;  // int16 column pairs of a 32-column block
constexpr int64_t kScalesOffset = kPairs * 32;
constexpr int64_t kBlockBytes = kScalesOffset + kPanelRows * 4;
// A slice of 64 blocks (2048 columns) makes an 8-row panel 34 KB, so that a stage holds at
// least 56 rows whatever the matrix's width, and each activation read serves them all. (Slices
// of 32 and 128 blocks measured no better at 2048 and 8192 columns, 512 tokens, Zen 5.)
constexpr int64_t kSliceBlocks = 64;
// Staged rows stay in L2 (Zen 2 has 512 KB) beside a chunk of the activations.
constexpr int64_t kStageBytes = 256 << 10;
constexpr int64_t kChunkBytes = 128 << 10;
// Staging prefetches each row this many bytes ahead.
constexpr int64_t kPrefetchBytes = 512;

// Stages blocks [b0, b1) of rows [r0, row_end) into num_panels panels (rows past row_end as
// zeros with scale 0).
// Not inlined, so that profiles show staging apart from the tiles.
__attribute__((noinline)) void stage_panels(const WeightMatrix& w, int64_t r0, int64_t row_end, int64_t num_panels,
                                            int64_t b0, int64_t b1, uint8_t* out) {
  const int64_t panel_bytes = (b1 - b0) * kBlockBytes;
  for (int64_t panel = 0; panel < num_panels; ++panel) {
    const uint8_t* src[kPanelRows];
    avx2_panels::panel_rows(w, r0, row_end, panel, src);
    for (int64_t b = b0; b < b1; ++b) {
      __m256i q[kPanelRows];  // row i's 32 codes
      alignas(16) uint16_t halves[kPanelRows];
      for (int i = 0; i < kPanelRows; ++i) {
        if (src[i] == nullptr) {
          q[i] = _mm256_setzero_si256();
          halves[i] = 0;  // f16 zero
          continue;
        }
        const uint8_t* block = src[i] + b * sizeof(BlockQ8_0);
        // The hardware prefetcher alone follows 8 row streams at half the DRAM bandwidth.
        _mm_prefetch(reinterpret_cast<const char*>(block + kPrefetchBytes), _MM_HINT_T0);
        q[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2));
        std::memcpy(&halves[i], block, 2);
      }
      // The int8 column pairs (16-bit words) transposed in three in-lane unpack rounds, which
      // every AVX2 CPU runs on two ports: word k of each 128-bit lane, rows 0..7, ends in
      // vector k, pair k in its low lane and pair k + 8 in its high lane. Sign-extended, each
      // half is one staged vector. (Widening first and transposing dwords took twice the
      // shuffles, and 16 live vectors that spilled.)
      __m256i words[kPanelRows];  // rows 2i, 2i + 1 interleaved: words 0-3 (even) or 4-7 (odd)
      for (int i = 0; i < kPanelRows; i += 2) {
        words[i] = _mm256_unpacklo_epi16(q[i], q[i + 1]);
        words[i + 1] = _mm256_unpackhi_epi16(q[i], q[i + 1]);
      }
      __m256i quads[kPanelRows];  // rows 4i..4i+3: words (0, 1), (2, 3), (4, 5), (6, 7)
      for (int i = 0; i < 2; ++i) {
        quads[4 * i] = _mm256_unpacklo_epi32(words[4 * i], words[4 * i + 2]);
        quads[4 * i + 1] = _mm256_unpackhi_epi32(words[4 * i], words[4 * i + 2]);
        quads[4 * i + 2] = _mm256_unpacklo_epi32(words[4 * i + 1], words[4 * i + 3]);
        quads[4 * i + 3] = _mm256_unpackhi_epi32(words[4 * i + 1], words[4 * i + 3]);
      }
      uint8_t* dst = out + panel * panel_bytes + (b - b0) * kBlockBytes;
      for (int k = 0; k < 4; ++k) {  // words 2k and 2k + 1 of rows 0..7
        const __m256i even = _mm256_unpacklo_epi64(quads[k], quads[4 + k]);
        const __m256i odd = _mm256_unpackhi_epi64(quads[k], quads[4 + k]);
        auto* v = reinterpret_cast<__m256i*>(dst);
        _mm256_store_si256(v + 2 * k, _mm256_cvtepi8_epi16(_mm256_castsi256_si128(even)));
        _mm256_store_si256(v + 2 * k + 1, _mm256_cvtepi8_epi16(_mm256_castsi256_si128(odd)));
        _mm256_store_si256(v + 2 * k + 8, _mm256_cvtepi8_epi16(_mm256_extracti128_si256(even, 1)));
        _mm256_store_si256(v + 2 * k + 9, _mm256_cvtepi8_epi16(_mm256_extracti128_si256(odd, 1)));
      }
      _mm256_store_ps(reinterpret_cast<float*>(dst + kScalesOffset),
                      _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(halves))));
    }
  }
}

// One tile's view of its tokens and output rows.
struct TileArgs {
  const uint8_t* panel;  // the first of P consecutive staged panels
  int64_t panel_bytes;   // bytes of one staged panel (the slice's blocks)
  int64_t num_blocks;    // blocks in the slice
  const int16_t* x[3];   // per token: its widened values from the slice's first column
  const float* dx[3];    // per token: its block scales from the slice's first block
  float* y[3];           // per token: its output at the tile's first row
  int valid_rows[2];     // rows of each panel inside the matrix
  bool accumulate;       // add to y (a slice after the first) instead of overwriting it
  avx2_panels::NextStagePrefetch* prefetch;
};

template <int P, int T>
void wide_tile(const TileArgs& a) {
  __m256 acc[P][T];
  for (int p = 0; p < P; ++p) {
    for (int t = 0; t < T; ++t) {
      if (!a.accumulate) {
        acc[p][t] = _mm256_setzero_ps();
      } else if (a.valid_rows[p] == kPanelRows) {
        acc[p][t] = _mm256_loadu_ps(a.y[t] + p * kPanelRows);
      } else {
        alignas(32) float lanes[kPanelRows] = {};
        std::memcpy(lanes, a.y[t] + p * kPanelRows, static_cast<size_t>(a.valid_rows[p]) * 4);
        acc[p][t] = _mm256_load_ps(lanes);
      }
    }
  }
  for (int64_t b = 0; b < a.num_blocks; ++b) {
    a.prefetch->step();
    const uint8_t* block = a.panel + b * kBlockBytes;
    __m256i dot[P][T];
    // Pair j of every tile row and token; pair 0 starts the sums (a plain accumulation: fully
    // unrolled, GCC schedules the products first and spills them).
    auto pair = [&](int j, auto first) {
      __m256i wv[P];
#pragma GCC unroll 2
      for (int p = 0; p < P; ++p) {
        wv[p] = _mm256_load_si256(reinterpret_cast<const __m256i*>(block + p * a.panel_bytes + j * 32));
      }
#pragma GCC unroll 3
      for (int t = 0; t < T; ++t) {
        const __m256i xb = _mm256_set1_epi32(
            static_cast<int32_t>(super_decode::load_u32(reinterpret_cast<const uint8_t*>(a.x[t] + b * 32 + 2 * j))));
#pragma GCC unroll 2
        for (int p = 0; p < P; ++p) {
          const __m256i prod = _mm256_madd_epi16(wv[p], xb);
          if constexpr (decltype(first)::value) {
            dot[p][t] = prod;
          } else {
            dot[p][t] = _mm256_add_epi32(dot[p][t], prod);
          }
        }
      }
    };
    pair(0, std::true_type{});
#pragma GCC unroll 3
    for (int j = 1; j < kPairs; ++j) pair(j, std::false_type{});
#pragma GCC unroll 2
    for (int p = 0; p < P; ++p) {
      const __m256 wd = _mm256_load_ps(reinterpret_cast<const float*>(block + p * a.panel_bytes + kScalesOffset));
#pragma GCC unroll 3
      for (int t = 0; t < T; ++t) {
        acc[p][t] =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[p][t]), _mm256_mul_ps(wd, _mm256_set1_ps(a.dx[t][b])), acc[p][t]);
      }
    }
  }
  for (int p = 0; p < P; ++p) {
    for (int t = 0; t < T; ++t) avx2_panels::store_panel_rows(acc[p][t], a.y[t] + p * kPanelRows, a.valid_rows[p]);
  }
}

template <int P>
void run_tiles(TileArgs& a, const QuantizedActivations& xq, const int16_t* widened, int64_t b0, int64_t chunk,
               int64_t chunk_end, float* y, int64_t y_stride, int64_t r0) {
  constexpr int kTokens = 3;
  const int64_t cols = xq.num_blocks * 32;
  auto tile = [&](auto tokens, int64_t t0) {
    constexpr int T = decltype(tokens)::value;
    for (int t = 0; t < T; ++t) {
      a.x[t] = widened + (t0 + t) * cols + b0 * 32;
      a.dx[t] = xq.scales + (t0 + t) * xq.num_blocks + b0;
      a.y[t] = y + (t0 + t) * y_stride + r0;
    }
    wide_tile<P, T>(a);
  };
  int64_t t = chunk;
  for (; t + kTokens <= chunk_end; t += kTokens) tile(std::integral_constant<int, kTokens>{}, t);
  if (chunk_end - t == 2) tile(std::integral_constant<int, 2>{}, t);
  if (chunk_end - t == 1) tile(std::integral_constant<int, 1>{}, t);
}

}  // namespace

void widen_activations_avx2(const QuantizedActivations& xq, int64_t token_begin, int64_t token_end, int16_t* out) {
  const int64_t first = token_begin * xq.num_blocks * 32;
  const int64_t last = token_end * xq.num_blocks * 32;
  for (int64_t i = first; i < last; i += 16) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(xq.qs + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_cvtepi8_epi16(q));
  }
}

void matmul_wide_panels_avx2(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  const WeightMatrix& w = *p.w;
  const QuantizedActivations& xq = *p.xq;
  KVLM_CHECK(w.type == GgmlType::kQ8_0 && p.x16 != nullptr, "matmul_wide_panels_avx2: weight type {}, int16 x {}",
             ggml_type_name(w.type), static_cast<const void*>(p.x16));
  const int64_t num_blocks = w.cols / 32;
  const int64_t slice_blocks = std::min(num_blocks, kSliceBlocks);
  const int64_t slice_panel_bytes = slice_blocks * kBlockBytes;
  const int64_t panels_per_stage = std::max<int64_t>(1, kStageBytes / slice_panel_bytes);
  thread_local ActivationBuffer staging;
  uint8_t* staged = staging.reserve(panels_per_stage * slice_panel_bytes);
  const int64_t tokens_per_chunk = std::max<int64_t>(3, kChunkBytes / (slice_blocks * 32 * 2) / 3 * 3);

  for (int64_t r0 = row_begin; r0 < row_end; r0 += panels_per_stage * kPanelRows) {
    const int64_t rows = std::min(row_end - r0, panels_per_stage * kPanelRows);
    const int64_t num_panels = (rows + kPanelRows - 1) / kPanelRows;
    for (int64_t b0 = 0; b0 < num_blocks; b0 += slice_blocks) {
      const int64_t b1 = std::min(num_blocks, b0 + slice_blocks);
      const int64_t panel_bytes = (b1 - b0) * kBlockBytes;
      stage_panels(w, r0, r0 + rows, num_panels, b0, b1, staged);
      // The next stage: this stage's rows' next slice, else the next rows' first.
      avx2_panels::NextStagePrefetch next;
      const int64_t next_r0 = b1 < num_blocks ? r0 : r0 + panels_per_stage * kPanelRows;
      const int64_t next_b0 = b1 < num_blocks ? b1 : 0;
      if (next_r0 < row_end) {
        const int64_t steps = avx2_panels::tiles_per_panel(p.token_begin, p.token_end, tokens_per_chunk, 3) *
                              ((num_panels + 1) / 2) * (b1 - b0);
        next = avx2_panels::NextStagePrefetch(
            w, next_r0, std::min(row_end, next_r0 + panels_per_stage * kPanelRows),
            next_b0 * static_cast<int64_t>(sizeof(BlockQ8_0)),
            std::min(num_blocks, next_b0 + slice_blocks) * static_cast<int64_t>(sizeof(BlockQ8_0)), steps);
      }
      // The tiles of a token chunk (its activations held in L2) run over each pair of panels.
      for (int64_t chunk = p.token_begin; chunk < p.token_end; chunk += tokens_per_chunk) {
        const int64_t chunk_end = std::min(p.token_end, chunk + tokens_per_chunk);
        for (int64_t panel = 0; panel < num_panels; panel += 2) {
          TileArgs a{};
          a.panel = staged + panel * panel_bytes;
          a.panel_bytes = panel_bytes;
          a.num_blocks = b1 - b0;
          a.accumulate = b0 > 0;
          a.prefetch = &next;
          for (int q = 0; q < 2; ++q) {
            a.valid_rows[q] = static_cast<int>(std::clamp<int64_t>(rows - (panel + q) * kPanelRows, 0, kPanelRows));
          }
          const int64_t panel_r0 = r0 + panel * kPanelRows;
          if (panel + 1 < num_panels) {
            run_tiles<2>(a, xq, p.x16, b0, chunk, chunk_end, p.y, w.rows, panel_r0);
          } else {
            run_tiles<1>(a, xq, p.x16, b0, chunk, chunk_end, p.y, w.rows, panel_r0);
          }
        }
      }
    }
  }
}

}  // namespace kvlm::ops_internal
