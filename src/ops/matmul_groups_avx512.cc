// AVX-512 VNNI kernel for Q8_0 / Q4_0 weights × groups of 16 tokens (TokenGroupActivations).
// Each 32-bit lane is one token. A few weight rows are first staged as signed bytes with f32
// scales (a "panel", reused by every token group of the call); then each vpdpbusd takes 4
// bytes of one row broadcast to all lanes, so a block's integer dot completes in 8
// instructions per row and group before one convert-and-scale. (A separate vpbroadcastd
// measured faster than vpdpbusd's embedded {1to16} broadcast on Zen 5.)
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
#include "ops/matmul_kernels.h"

namespace kvlm::ops_internal {
namespace {

constexpr int kTokens = TokenGroupActivations::kTokens;
// Register tile: kRows rows × kGroups groups of 16 tokens: 8 int32 and 8 f32 accumulators
// plus the activation vectors of one 4-byte step.
constexpr int kRows = 4;
constexpr int kGroups = 2;

// Up to kRows weight rows as the kernel wants them: vpdpbusd multiplies the activations
// (unsigned, +128) by these signed bytes, so each block also keeps -128 · (sum of its quants).
struct RowPanel {
  int64_t num_blocks = 0;
  int8_t* qs = nullptr;           // [kRows, num_blocks, 32]
  float* scales = nullptr;        // [kRows, num_blocks]
  int32_t* correction = nullptr;  // [kRows, num_blocks]

  static RowPanel for_thread(int64_t num_blocks) {
    thread_local ActivationBuffer storage;
    uint8_t* bytes = storage.reserve(kRows * num_blocks * (32 + 4 + 4));
    RowPanel panel;
    panel.num_blocks = num_blocks;
    panel.qs = reinterpret_cast<int8_t*>(bytes);
    panel.scales = reinterpret_cast<float*>(bytes + kRows * num_blocks * 32);
    panel.correction = reinterpret_cast<int32_t*>(bytes + kRows * num_blocks * (32 + 4));
    return panel;
  }
};

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// Sum of 32 signed bytes: vpsadbw adds unsigned bytes, so shift them by 128 and back.
inline int32_t sum_bytes(__m256i q) {
  const __m256i sums = _mm256_sad_epu8(_mm256_xor_si256(q, _mm256_set1_epi8(-128)), _mm256_setzero_si256());
  const __m128i s = _mm_add_epi64(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1));
  return static_cast<int32_t>(_mm_cvtsi128_si64(s) + _mm_extract_epi64(s, 1)) - 32 * 128;
}

inline void stage_block(const RowPanel& panel, int64_t idx, __m256i q, float scale) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(panel.qs + idx * 32), q);
  panel.scales[idx] = scale;
  panel.correction[idx] = -128 * sum_bytes(q);
}

void stage_q8_0_row(const uint8_t* row, int local_row, const RowPanel& panel) {
  for (int64_t b = 0; b < panel.num_blocks; ++b) {
    const uint8_t* block = row + b * static_cast<int64_t>(sizeof(BlockQ8_0));
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2));
    stage_block(panel, local_row * panel.num_blocks + b, q, half_at(block));
  }
}

// Q4_0 byte i holds element i (low nibble) and i+16 (high nibble), both stored + 8.
void stage_q4_0_row(const uint8_t* row, int local_row, const RowPanel& panel) {
  const __m256i low_nibbles = _mm256_set1_epi8(0x0f);
  const __m256i eight = _mm256_set1_epi8(8);
  for (int64_t b = 0; b < panel.num_blocks; ++b) {
    const uint8_t* block = row + b * static_cast<int64_t>(sizeof(BlockQ4_0));
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2));
    const __m256i nibbles = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), low_nibbles);
    stage_block(panel, local_row * panel.num_blocks + b, _mm256_sub_epi8(nibbles, eight), half_at(block));
  }
}

inline __m512i broadcast_u32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// y for panel rows [p0, p0 + R) (global rows r0...) × token groups [g0, g0 + G).
// `prefetch` (or null) is the weight bytes the next panel will stage, fetched while this
// tile computes so that staging does not wait on memory.
template <int R, int G>
void group_tile(const RowPanel& panel, int p0, const TokenGroupActivations& xg, int64_t g0, float* y, int64_t num_rows,
                int64_t r0, const uint8_t* prefetch, int64_t prefetch_stride) {
  const int64_t num_blocks = panel.num_blocks;
  __m512 acc[R][G];  // lane i: token (g0 + g)·16 + i
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) acc[r][g] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < num_blocks; ++b) {
    if (prefetch != nullptr) {
      const int64_t offset = b * prefetch_stride / num_blocks;  // block b of each next row
      for (int r = 0; r < kRows; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(prefetch + r * prefetch_stride + offset), _MM_HINT_T0);
      }
    }
    const uint8_t* xs[G];
    __m512i dot[R][G];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512i correction = _mm512_set1_epi32(panel.correction[(p0 + r) * num_blocks + b]);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) dot[r][g] = correction;
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) xs[g] = xg.qs + ((g0 + g) * num_blocks + b) * 8 * kTokens * 4;
#pragma GCC unroll 8
    for (int lane = 0; lane < 8; ++lane) {
      __m512i xv[G];
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) xv[g] = _mm512_loadu_si512(xs[g] + lane * kTokens * 4);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512i wv = broadcast_u32(panel.qs + ((p0 + r) * num_blocks + b) * 32 + lane * 4);
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) dot[r][g] = _mm512_dpbusd_epi32(dot[r][g], xv[g], wv);
      }
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const __m512 xd = _mm512_loadu_ps(xg.scales + ((g0 + g) * num_blocks + b) * kTokens);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(panel.scales[(p0 + r) * num_blocks + b]), xd);
        acc[r][g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r][g]), scale, acc[r][g]);
      }
    }
  }
  for (int g = 0; g < G; ++g) {
    const int64_t num_valid = std::min<int64_t>(kTokens, xg.num_tokens - (g0 + g) * kTokens);
    for (int r = 0; r < R; ++r) {
      alignas(64) float lanes[kTokens];
      _mm512_store_ps(lanes, acc[r][g]);
      float* out = y + (g0 + g) * kTokens * num_rows + r0 + r;
      for (int64_t i = 0; i < num_valid; ++i) out[i * num_rows] = lanes[i];
    }
  }
}

template <int R>
void panel_groups(const RowPanel& panel, int p0, const MatmulProblem& p, int64_t r0, const uint8_t* next_panel) {
  const int64_t stride = static_cast<int64_t>(p.w->row_bytes);
  int64_t g = p.group_begin;
  for (; g + kGroups <= p.group_end; g += kGroups) {
    group_tile<R, kGroups>(panel, p0, *p.xg, g, p.y, p.w->rows, r0, g == p.group_begin ? next_panel : nullptr, stride);
  }
  for (; g < p.group_end; ++g) {
    group_tile<R, 1>(panel, p0, *p.xg, g, p.y, p.w->rows, r0, g == p.group_begin ? next_panel : nullptr, stride);
  }
}

}  // namespace

void matmul_token_groups_avx512(const MatmulProblem& p, int64_t row_begin, int64_t row_end) {
  count_isa_kernel_run(Isa::kAvx512);
  const WeightMatrix& w = *p.w;
  KVLM_CHECK(w.type == GgmlType::kQ8_0 || w.type == GgmlType::kQ4_0, "matmul_token_groups_avx512: weight type {}",
             ggml_type_name(w.type));
  const RowPanel panel = RowPanel::for_thread(p.xg->num_blocks);
  for (int64_t r0 = row_begin; r0 < row_end; r0 += kRows) {
    const int num_panel_rows = static_cast<int>(std::min<int64_t>(kRows, row_end - r0));
    for (int i = 0; i < num_panel_rows; ++i) {
      const uint8_t* row = w.data + static_cast<uint64_t>(r0 + i) * w.row_bytes;
      if (w.type == GgmlType::kQ8_0) {
        stage_q8_0_row(row, i, panel);
      } else {
        stage_q4_0_row(row, i, panel);
      }
    }
    const uint8_t* next_panel =
        r0 + 2 * kRows <= row_end ? w.data + static_cast<uint64_t>(r0 + kRows) * w.row_bytes : nullptr;
    if (num_panel_rows == kRows) {
      panel_groups<kRows>(panel, 0, p, r0, next_panel);
    } else {
      for (int i = 0; i < num_panel_rows; ++i) panel_groups<1>(panel, i, p, r0 + i, nullptr);
    }
  }
}

}  // namespace kvlm::ops_internal
