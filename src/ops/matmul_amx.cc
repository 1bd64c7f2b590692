// AMX kernel for batches: Q8_0 / Q4_0 weights × groups of 16 tokens, on BF16 tiles.
//
// Why BF16 and not INT8 tiles: Q8_0 / Q4_0 carry a scale per block of 32, so an INT8 tile
// product covers one block only (K = 32, half the unit's width) and every block's 16 × 16 int32
// result must leave the tile to be scaled in f32 (a tile store and 48 vector instructions per
// 8k multiply-adds). Measured here (Sapphire Rapids, 2 threads, 2048 × 2048 × 512 tokens) such
// a kernel ran 5.6 ms against 7.3 ms for the AVX-512 VNNI one. With the weights dequantized to
// bf16 once per call, one TDPBF16PS takes 32 elements of every row and token and accumulates
// in f32 across the whole row, inside the tile: 2.9 ms with one bf16 term per weight, 4.5 ms
// with the two kept for precision (below).
//
// Precision: each weight d·q becomes two bf16 terms, head + tail (|d·q - head - tail| ≤ 2^-16
// |d·q|; two tile products per 32 columns), and each activation is rounded to bf16 (≤ 2^-8
// relative, never more than the other kernels' int8 blocks lose: d_x/2 with d_x = amax/127).
// tests/ops/matmul_test.cc bounds the error per element; per-token KLD from F32 models is half the
// int8 path's (docs/ARCHITECTURE.md, "AMX").
// Layout: a "row block" (≤ 768 KB of staged weights) is dequantized into panels of 16 rows, two
// A tiles (16 rows × 32 bf16: heads, tails) per 32 columns; it stays in L2 while every token
// group of the call passes over it. Tiles are 2 panels × 2 groups: four C tiles accumulate over
// the whole row, fed by four A and two B loads per 32 columns.
// GCC 12's AVX-512 intrinsic headers seed results with _mm*_undefined_*(), which its own
// uninitialized-use warnings flag at every call site (GCC bug 105593); the code is fine.
#if !defined(__clang__)  // clang has no -Wmaybe-uninitialized
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "ops/matmul_decode_avx2.h"
#include "ops/matmul_kernels.h"

namespace kvlm::ops_internal {
namespace {

constexpr int kTokens = Bf16TokenGroups::kTokens;
constexpr int kPanelRows = 16;                                 // a tile's rows
constexpr int kChunk = Bf16TokenGroups::kChunk;                // columns per tile product
constexpr int64_t kRowBlockBytes = int64_t{768} << 10;         // staged bf16 weights per row block
constexpr int64_t kMaxRowBlockRows = 512;

// Tile registers: four C (accumulator) tiles, C[p][g] = panel p × token group g, and the A
// (panel) and B (group) tiles feeding them. Macros, not constants: GCC's tile intrinsics paste
// the number into the instruction's text.
#define KVLM_TILE_C00 0
#define KVLM_TILE_C01 1
#define KVLM_TILE_C10 2
#define KVLM_TILE_C11 3
#define KVLM_TILE_A0 4
#define KVLM_TILE_A1 5
#define KVLM_TILE_B0 6
#define KVLM_TILE_B1 7

// LDTILECFG's 64-byte operand (palette 1): all eight tiles 16 rows × 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

TileConfig make_tile_config() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = 16;
    config.colsb[t] = 64;
  }
  return config;
}

// The tile configuration is per thread: every call loads it and releases the tiles after,
// so no thread keeps the 8 KB tile state live between matmuls.
class TileScope {
 public:
  TileScope() {
    static const TileConfig config = make_tile_config();
    _tile_loadconfig(&config);
  }
  ~TileScope() { _tile_release(); }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

// The weights of one row block as bf16 A tiles, each weight as head + tail: panel p, chunk c
// at qs + (p · num_chunks + c) · 1024 bf16: the heads (16 rows × 32), then the tails. Rows past
// the matrix are zeros.
struct RowBlock {
  int64_t num_chunks = 0;
  uint16_t* qs = nullptr;

  const uint16_t* tile(int64_t panel, int64_t chunk) const { return qs + (panel * num_chunks + chunk) * 1024; }
  uint16_t* row(int64_t local_row) const {  // chunk 0 of that row; chunk c is 1024 values further
    return qs + ((local_row / kPanelRows) * num_chunks * 1024) + (local_row % kPanelRows) * kChunk;
  }

  static RowBlock for_thread(int64_t num_rows, int64_t num_chunks) {
    thread_local ActivationBuffer storage;
    RowBlock block;
    block.num_chunks = num_chunks;
    block.qs = reinterpret_cast<uint16_t*>(storage.reserve(num_rows * num_chunks * kChunk * 4));
    return block;
  }
};

inline __m512 bf16_to_f32(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }

// 32 int8 values × d (exact in f32) as two bf16 terms, w ≈ head + tail (round to nearest even
// each): head at out, tail at out + 512 (the next tile of the row block).
inline void store_scaled_bf16(__m256i q, float d, uint16_t* out) {
  const __m512 scale = _mm512_set1_ps(d);
  const __m512 w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))), scale);
  const __m512 w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1))), scale);
  const __m512i head = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(w1, w0));
  // w - head is exact in f32 (w has at most 19 significant bits).
  const __m512 t0 = _mm512_sub_ps(w0, bf16_to_f32(_mm512_castsi512_si256(head)));
  const __m512 t1 = _mm512_sub_ps(w1, bf16_to_f32(_mm512_extracti64x4_epi64(head, 1)));
  _mm512_store_si512(out, head);
  _mm512_store_si512(out + 512, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(t1, t0)));
}

void stage_q8_0_row(const uint8_t* row, uint16_t* out, int64_t num_chunks) {
  for (int64_t b = 0; b < num_chunks; ++b) {
    const uint8_t* block = row + b * static_cast<int64_t>(sizeof(BlockQ8_0));
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2));
    store_scaled_bf16(q, half_f16c(block), out + 2 * b * 512);
  }
}

// Q4_0 byte i holds element i (low nibble) and i+16 (high nibble), both stored + 8.
void stage_q4_0_row(const uint8_t* row, uint16_t* out, int64_t num_chunks) {
  const __m256i eight = _mm256_set1_epi8(8);
  for (int64_t b = 0; b < num_chunks; ++b) {
    const uint8_t* block = row + b * static_cast<int64_t>(sizeof(BlockQ4_0));
    const __m256i nibbles = nibbles_to_bytes(load128(block + 2));
    store_scaled_bf16(_mm256_sub_epi8(nibbles, eight), half_f16c(block), out + 2 * b * 512);
  }
}

void stage_row_block(const WeightMatrix& w, int64_t r0, int64_t num_rows, int64_t num_padded_rows,
                     const RowBlock& block) {
  for (int64_t i = 0; i < num_padded_rows; ++i) {
    uint16_t* out = block.row(i);
    if (i >= num_rows) {
      for (int64_t c = 0; c < 2 * block.num_chunks; ++c) std::memset(out + c * 512, 0, kChunk * 2);
      continue;
    }
    const uint8_t* row = w.data + static_cast<uint64_t>(r0 + i) * w.row_bytes;
    if (w.type == GgmlType::kQ8_0) {
      stage_q8_0_row(row, out, block.num_chunks);
    } else {
      stage_q4_0_row(row, out, block.num_chunks);
    }
  }
}

// In place: r[m] lane i becomes r[i] lane m (16 × 16 32-bit values).
inline void transpose_16x16(__m512 (&r)[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {  // pairs of rows, interleaved within each 128-bit lane
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // r[4i + k], lane j: column 4j + k of rows 4i..4i+3
    r[4 * i + 0] = _mm512_shuffle_ps(t[4 * i + 0], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i + 0], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  __m512 out[16];
  for (int k = 0; k < 4; ++k) {  // 4 × 4 transpose of 128-bit lanes
    const __m512 u0 = _mm512_shuffle_f32x4(r[k], r[4 + k], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 u1 = _mm512_shuffle_f32x4(r[k], r[4 + k], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512 u2 = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 u3 = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], _MM_SHUFFLE(3, 2, 3, 2));
    out[0 + k] = _mm512_shuffle_f32x4(u0, u2, _MM_SHUFFLE(2, 0, 2, 0));
    out[4 + k] = _mm512_shuffle_f32x4(u0, u2, _MM_SHUFFLE(3, 1, 3, 1));
    out[8 + k] = _mm512_shuffle_f32x4(u1, u3, _MM_SHUFFLE(2, 0, 2, 0));
    out[12 + k] = _mm512_shuffle_f32x4(u1, u3, _MM_SHUFFLE(3, 1, 3, 1));
  }
  for (int i = 0; i < 16; ++i) r[i] = out[i];
}

// Writes one stored C tile (c[m · 16 + i]: row m, token i) to y[token][row].
void store_tile(const float* c, float* y, int64_t num_rows, int64_t first_token, int64_t num_valid_tokens, int64_t r0,
                int num_valid_rows) {
  __m512 r[16];
  for (int m = 0; m < 16; ++m) r[m] = _mm512_load_ps(c + m * kTokens);
  transpose_16x16(r);  // r[i]: token i, lane m: row m
  const __mmask16 row_mask = static_cast<__mmask16>((1u << num_valid_rows) - 1);
  for (int64_t i = 0; i < num_valid_tokens; ++i) {
    _mm512_mask_storeu_ps(y + (first_token + i) * num_rows + r0, row_mask, r[i]);
  }
}

// The next row block's weights, fetched into L2 a few lines per tile step while this block
// computes, so that staging it does not wait on DRAM (small batches are bandwidth-bound).
struct Prefetch {
  const char* next = nullptr;
  const char* end = nullptr;
  int64_t lines_per_step = 0;

  void step() {
    for (int64_t i = 0; i < lines_per_step && next < end; ++i, next += 64) _mm_prefetch(next, _MM_HINT_T1);
  }
};

// y for panels [p0, p0 + P) of the row block (global rows from r0) × groups [g0, g0 + G).
template <int P, int G>
void tile(const RowBlock& block, int64_t p0, const Bf16TokenGroups& xb, int64_t g0, float* y, int64_t num_rows,
          int64_t r0, int64_t row_end, Prefetch& prefetch) {
  const int64_t num_chunks = block.num_chunks;
  const uint16_t* a0 = block.tile(p0, 0);
  const uint16_t* a1 = P == 2 ? block.tile(p0 + 1, 0) : nullptr;
  const uint16_t* b0 = xb.tile(g0, 0);
  const uint16_t* b1 = G == 2 ? xb.tile(g0 + 1, 0) : nullptr;
  _tile_zero(KVLM_TILE_C00);
  if constexpr (G == 2) _tile_zero(KVLM_TILE_C01);
  if constexpr (P == 2) _tile_zero(KVLM_TILE_C10);
  if constexpr (P == 2 && G == 2) _tile_zero(KVLM_TILE_C11);
  for (int64_t c = 0; c < num_chunks; ++c) {
    prefetch.step();
    _tile_loadd(KVLM_TILE_B0, b0 + c * 512, 64);
    if constexpr (G == 2) _tile_loadd(KVLM_TILE_B1, b1 + c * 512, 64);
    for (int part = 0; part < 2; ++part) {  // the heads, then the tails of the weights
      _tile_loadd(KVLM_TILE_A0, a0 + c * 1024 + part * 512, 64);
      _tile_dpbf16ps(KVLM_TILE_C00, KVLM_TILE_A0, KVLM_TILE_B0);
      if constexpr (G == 2) _tile_dpbf16ps(KVLM_TILE_C01, KVLM_TILE_A0, KVLM_TILE_B1);
      if constexpr (P == 2) {
        _tile_loadd(KVLM_TILE_A1, a1 + c * 1024 + part * 512, 64);
        _tile_dpbf16ps(KVLM_TILE_C10, KVLM_TILE_A1, KVLM_TILE_B0);
        if constexpr (G == 2) _tile_dpbf16ps(KVLM_TILE_C11, KVLM_TILE_A1, KVLM_TILE_B1);
      }
    }
  }
  alignas(64) float c[4][kPanelRows * kTokens];
  _tile_stored(KVLM_TILE_C00, c[0], 64);
  if constexpr (G == 2) _tile_stored(KVLM_TILE_C01, c[1], 64);
  if constexpr (P == 2) _tile_stored(KVLM_TILE_C10, c[2], 64);
  if constexpr (P == 2 && G == 2) _tile_stored(KVLM_TILE_C11, c[3], 64);
  for (int p = 0; p < P; ++p) {
    const int64_t row0 = r0 + (p0 + p) * kPanelRows;
    const int num_valid_rows = static_cast<int>(std::clamp<int64_t>(row_end - row0, 0, kPanelRows));
    for (int g = 0; g < G; ++g) {
      const int64_t first_token = (g0 + g) * kTokens;
      store_tile(c[2 * p + g], y, num_rows, first_token, std::min<int64_t>(kTokens, xb.num_tokens - first_token), row0,
                 num_valid_rows);
    }
  }
}

template <int G>
void panels_of_block(const RowBlock& block, int64_t num_panels, const MatmulProblem& p, int64_t g, int64_t r0,
                     int64_t row_end, Prefetch& prefetch) {
  int64_t panel = 0;
  for (; panel + 2 <= num_panels; panel += 2) tile<2, G>(block, panel, *p.xb, g, p.y, p.w->rows, r0, row_end, prefetch);
  if (panel < num_panels) tile<1, G>(block, panel, *p.xb, g, p.y, p.w->rows, r0, row_end, prefetch);
}

}  // namespace

void matmul_token_groups_amx(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  count_isa_kernel_run(Isa::kAmx);
  const WeightMatrix& w = *p.w;
  KVLM_CHECK(w.type == GgmlType::kQ8_0 || w.type == GgmlType::kQ4_0, "matmul_token_groups_amx: weight type {}",
             ggml_type_name(w.type));
  KVLM_CHECK(p.xb != nullptr && p.xb->num_chunks * kChunk == w.cols, "matmul_token_groups_amx: activations for {} cols",
             w.cols);
  const int64_t num_chunks = p.xb->num_chunks;
  const int64_t block_rows = std::clamp<int64_t>(kRowBlockBytes / (w.cols * 4) / 32 * 32, 32, kMaxRowBlockRows);
  const RowBlock block = RowBlock::for_thread(block_rows, num_chunks);
  const TileScope tiles;
  for (int64_t r0 = row_begin; r0 < row_end; r0 += block_rows) {
    const int64_t num_rows = std::min(block_rows, row_end - r0);
    const int64_t num_panels = (num_rows + kPanelRows - 1) / kPanelRows;
    stage_row_block(w, r0, num_rows, num_panels * kPanelRows, block);
    // GCC's tileloadd does not tell the compiler it reads memory: the staged rows must be
    // written before the first tile load.
    __asm__ volatile("" ::: "memory");
    const int64_t block_end = r0 + num_rows;
    // Spread the next block's lines over this block's first pass (its first group or pair).
    Prefetch prefetch;
    if (block_end < row_end) {
      const int64_t next_rows = std::min(block_rows, row_end - block_end);
      prefetch.next = reinterpret_cast<const char*>(w.data + static_cast<uint64_t>(block_end) * w.row_bytes);
      prefetch.end = prefetch.next + next_rows * static_cast<int64_t>(w.row_bytes);
      const int64_t steps = (num_panels + 1) / 2 * num_chunks;
      prefetch.lines_per_step = (next_rows * static_cast<int64_t>(w.row_bytes) / 64 + steps - 1) / steps;
    }
    int64_t g = p.group_begin;
    for (; g + 2 <= p.group_end; g += 2) panels_of_block<2>(block, num_panels, p, g, r0, block_end, prefetch);
    if (g < p.group_end) panels_of_block<1>(block, num_panels, p, g, r0, block_end, prefetch);
  }
}

void convert_bf16_token_groups(const float* x, int64_t cols, int64_t group_begin, int64_t group_end,
                               const Bf16TokenGroups& out) {
  for (int64_t g = group_begin; g < group_end; ++g) {
    for (int64_t c = 0; c < out.num_chunks; ++c) {
      __m512 pairs[16];  // pairs[i] dword k: token i's columns 32c + 2k, 32c + 2k + 1 as bf16
      for (int i = 0; i < kTokens; ++i) {
        const int64_t t = g * kTokens + i;
        if (t >= out.num_tokens) {
          pairs[i] = _mm512_setzero_ps();
          continue;
        }
        const float* src = x + t * cols + c * kChunk;
        const __m512bh bf = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + 16), _mm512_loadu_ps(src));
        pairs[i] = reinterpret_cast<__m512>(bf);
      }
      transpose_16x16(pairs);  // pairs[k] lane i: token i's pair k: B tile row k
      uint16_t* dst = out.qs + (g * out.num_chunks + c) * 512;
      for (int k = 0; k < 16; ++k) _mm512_store_ps(reinterpret_cast<float*>(dst + k * 32), pairs[k]);
    }
  }
}

#undef KVLM_TILE_C00
#undef KVLM_TILE_C01
#undef KVLM_TILE_C10
#undef KVLM_TILE_C11
#undef KVLM_TILE_A0
#undef KVLM_TILE_A1
#undef KVLM_TILE_B0
#undef KVLM_TILE_B1

}  // namespace kvlm::ops_internal
