// Internal to ops/: an f16 scale read from a weight block and converted by F16C. Exact, as the
// portable fp16_to_fp32, in one instruction where that one branches and shifts in scalar code
// (a K-quant block's d and dmin paid it on every row). Included only by files compiled with
// F16C; unnamed namespace: each ISA's file compiles its own copy with its own flags.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace kvlm::ops_internal {
namespace {

inline float half_f16c(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

}  // namespace
}  // namespace kvlm::ops_internal
