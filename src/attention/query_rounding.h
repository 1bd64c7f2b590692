// query_rounding: the integer queries that q·k over int8 and int4 keys is computed with.
#pragma once

// Over integer key codes the kernels compute q·k in the integer domain: each scaled
// query row (one query, one head) is rounded once per task to integers in
// [-kQueryIntMax, kQueryIntMax] with one f32 step per row, and multiplied with the
// codes in 16-bit lanes (pmaddwd, or VNNI's vpdpwssd) instead of decoding every key
// to f32. 15 bits rather than 8: the rounding moves a score by at most
// step/2 × Σ|k| = max|q| × Σ|k| / 32766, far below what the key codecs themselves
// lose (int8 keys: max|k| / 254 per value), so the quality is the codec's, and
// the int32 sums cannot overflow for head_dim up to 1,032 (127 × 16383 × 1032 < 2^31).
//
// Shared by the kernels (one copy per ISA file) and the reference, which rounds the same
// way when told to: every function here is static (internal linkage), so no copy compiled
// for a wider ISA can be merged into another file's callers.

#include <cstdint>

#include "kv/kv_type.h"

namespace kvlm::query_rounding {

inline constexpr int kQueryIntMax = 16383;

// Whether paged attention rounds queries for keys of this type.
static constexpr bool rounds_queries(KvType k_type) { return k_type == KvType::kInt8 || k_type == KvType::kInt4; }

// out[d] = round(q[d] * scale / step) with step = max|q * scale| / kQueryIntMax
// (round to nearest even); returns step (0 for an all-zero row, NaN for a row holding
// a NaN or an infinity, so that it poisons the scores as f32 arithmetic would). The
// query is scaled in f32 first, exactly as the kernels scale it.
static inline float round_query_row(const float* q, int n, float scale, int16_t* out) {
  float max_abs = 0.0f;
  bool finite = true;
  for (int d = 0; d < n; ++d) {
    const float x = q[d] * scale;
    const float a = x < 0.0f ? -x : x;
    finite = finite && a <= 3.4028235e38f;  // false for NaN and infinities
    max_abs = a > max_abs ? a : max_abs;
  }
  if (!finite || !(max_abs > 0.0f)) {
    for (int d = 0; d < n; ++d) out[d] = 0;
    return finite ? 0.0f : __builtin_nanf("");
  }
  const float inv_step = static_cast<float>(kQueryIntMax) / max_abs;
  for (int d = 0; d < n; ++d) {
    const float r = __builtin_rintf((q[d] * scale) * inv_step);
    // max_abs * inv_step may round to just above kQueryIntMax; rint brings it back.
    out[d] = static_cast<int16_t>(r > kQueryIntMax ? kQueryIntMax : r < -kQueryIntMax ? -kQueryIntMax : r);
  }
  return max_abs / static_cast<float>(kQueryIntMax);
}

// The values a rounded row stands for, scale included: out[d] = codes[d] × step (codes gets
// round_query_row's integers). What the kernels' integer q·k equals, for the reference and the
// weights pass to score with.
template <class T>
static inline void rounded_query_values(const float* q, int n, float scale, int16_t* codes, T* out) {
  const T step = static_cast<T>(round_query_row(q, n, scale, codes));
  for (int d = 0; d < n; ++d) out[d] = static_cast<T>(codes[d]) * step;
}

}  // namespace kvlm::query_rounding
