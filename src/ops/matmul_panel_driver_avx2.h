// The loop both AVX2 panel GEMMs run (matmul_panels_avx2.cc on 32-element activations,
// matmul_super_panels_avx2.cc on super-block ones): a thread's rows are staged, an L2-sized block
// at a time, into 8-row panels, and each token tile of a chunk of the call's tokens, held in L2,
// runs over each panel while it stays in L1.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ops/matmul_kernels.h"

namespace kvlm::ops_internal::avx2_panels {

inline constexpr int kPanelRows = 8;
// Staged rows of one block stay in L2 while every token tile runs over them (Zen 2 has 512 KB).
inline constexpr int64_t kStageBytes = 192 << 10;
// The activations of a token chunk stay in L2 too, beside the staged rows.
inline constexpr int64_t kChunkBytes = 192 << 10;

// The source rows of panel `panel` of a stage whose first row is r0: nullptr for rows past row_end.
inline void panel_rows(const WeightMatrix& w, int64_t r0, int64_t row_end, int64_t panel,
                       const uint8_t* (&src)[kPanelRows]) {
  for (int i = 0; i < kPanelRows; ++i) {
    const int64_t row = r0 + panel * kPanelRows + i;
    src[i] = row < row_end ? w.data + static_cast<uint64_t>(row) * w.row_bytes : nullptr;
  }
}

// Brings the bytes the next stage will read into L2 while the tiles run over this one, a few
// lines per step (a tile calls step() once per block of its loop), so that staging does not
// wait on DRAM. With few tokens (batched decode) the tiles are short, and staging that waited
// for its rows took about as long as they did (Q8_0 2048², 16 tokens, AVX2 on Zen 5: staging
// 41% of the samples; 10% faster with the prefetch alone).
struct NextStagePrefetch {
  const uint8_t* data = nullptr;  // the matrix
  uint64_t row_bytes = 0;
  int64_t row = 0;      // the next line's row
  int64_t row_end = 0;  // past the stage's rows (row == row_end: nothing left)
  int64_t begin = 0;    // the stage's bytes in each row, from a line's start
  int64_t end = 0;
  int64_t offset = 0;  // the next line's byte in its row
  int64_t lines_per_step = 1;

  // Rows [row, row_end), bytes [byte_begin, byte_end) of each, spread over `steps` calls of step().
  NextStagePrefetch() = default;
  NextStagePrefetch(const WeightMatrix& w, int64_t row_begin, int64_t row_end_, int64_t byte_begin, int64_t byte_end,
                    int64_t steps)
      : data(w.data),
        row_bytes(w.row_bytes),
        row(row_begin),
        row_end(row_end_),
        begin(byte_begin / 64 * 64),
        end(byte_end),
        offset(byte_begin / 64 * 64) {
    const int64_t lines = std::max<int64_t>(0, row_end - row) * ((end - begin + 63) / 64);
    steps = std::max<int64_t>(1, steps);
    lines_per_step = (lines + steps - 1) / steps;
  }

  void step() {
    for (int64_t i = 0; i < lines_per_step && row < row_end; ++i) {
      _mm_prefetch(reinterpret_cast<const char*>(data + static_cast<uint64_t>(row) * row_bytes + offset), _MM_HINT_T1);
      offset += 64;
      if (offset >= end) {
        offset = begin;
        ++row;
      }
    }
  }
};

// Tiles of kTokens over tokens [begin, end) in chunks of tokens_per_chunk: how many a stage runs
// per panel.
inline int64_t tiles_per_panel(int64_t begin, int64_t end, int64_t tokens_per_chunk, int tokens_per_tile) {
  int64_t tiles = 0;
  for (int64_t chunk = begin; chunk < end; chunk += tokens_per_chunk) {
    tiles += (std::min(end, chunk + tokens_per_chunk) - chunk + tokens_per_tile - 1) / tokens_per_tile;
  }
  return tiles;
}

// Rows [row_begin, row_end) × tokens [p.token_begin, p.token_end):
//   stage(r0, stage_end, num_panels, out) stages rows [r0, stage_end) into num_panels panels of
//     panel_bytes each (the rows past stage_end as zeros);
//   tile(std::integral_constant<int, T>, panel, t, panel_r0, valid_rows, prefetch) runs tokens
//     [t, t + T) over one staged panel, whose first row is panel_r0 and of whose rows valid_rows
//     are real, and calls prefetch.step() steps_per_tile times on the way.
// Tiles take kTokens tokens; a chunk's last 1-3 tokens take one smaller tile.
template <int kTokens, class Stage, class Tile>
void run_staged_panels(const MatmulProblem& p, int64_t row_begin, int64_t row_end, int64_t panel_bytes,
                       int64_t activation_bytes_per_token, int64_t steps_per_tile, const Stage& stage,
                       const Tile& tile) {
  thread_local ActivationBuffer buffer;
  const int64_t panels_per_stage = std::max<int64_t>(1, kStageBytes / panel_bytes);
  uint8_t* staged = buffer.reserve(panels_per_stage * panel_bytes);
  const int64_t tokens_per_chunk =
      std::max<int64_t>(kTokens, kChunkBytes / activation_bytes_per_token / kTokens * kTokens);
  for (int64_t r0 = row_begin; r0 < row_end; r0 += panels_per_stage * kPanelRows) {
    const int64_t rows = std::min(row_end - r0, panels_per_stage * kPanelRows);
    const int64_t num_panels = (rows + kPanelRows - 1) / kPanelRows;
    stage(r0, r0 + rows, num_panels, staged);
    const int64_t next_r0 = r0 + panels_per_stage * kPanelRows;
    NextStagePrefetch prefetch;
    if (next_r0 < row_end) {
      const int64_t steps =
          tiles_per_panel(p.token_begin, p.token_end, tokens_per_chunk, kTokens) * num_panels * steps_per_tile;
      prefetch = NextStagePrefetch(*p.w, next_r0, std::min(row_end, next_r0 + panels_per_stage * kPanelRows), 0,
                                   static_cast<int64_t>(p.w->row_bytes), steps);
    }
    for (int64_t chunk = p.token_begin; chunk < p.token_end; chunk += tokens_per_chunk) {
      const int64_t chunk_end = std::min(p.token_end, chunk + tokens_per_chunk);
      for (int64_t panel = 0; panel < num_panels; ++panel) {
        const uint8_t* panel_data = staged + panel * panel_bytes;
        const int64_t panel_r0 = r0 + panel * kPanelRows;
        const int valid = static_cast<int>(std::min<int64_t>(kPanelRows, rows - panel * kPanelRows));
        int64_t t = chunk;
        for (; t + kTokens <= chunk_end; t += kTokens) {
          tile(std::integral_constant<int, kTokens>{}, panel_data, t, panel_r0, valid, prefetch);
        }
        switch (chunk_end - t) {
          case 3:
            if constexpr (kTokens > 3) tile(std::integral_constant<int, 3>{}, panel_data, t, panel_r0, valid, prefetch);
            break;
          case 2:
            tile(std::integral_constant<int, 2>{}, panel_data, t, panel_r0, valid, prefetch);
            break;
          case 1:
            tile(std::integral_constant<int, 1>{}, panel_data, t, panel_r0, valid, prefetch);
            break;
          default:
            break;
        }
      }
    }
  }
}

// Stores a panel's 8 rows (one lane each) at out, only the first valid_rows of them.
inline void store_panel_rows(__m256 rows, float* out, int valid_rows) {
  if (valid_rows == kPanelRows) {
    _mm256_storeu_ps(out, rows);
  } else {
    alignas(32) float lanes[kPanelRows];
    _mm256_store_ps(lanes, rows);
    std::memcpy(out, lanes, static_cast<size_t>(valid_rows) * 4);
  }
}

}  // namespace kvlm::ops_internal::avx2_panels
