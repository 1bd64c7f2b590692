// kv_format: the byte layout of one encoded block for every KvType, as integer arithmetic.
#pragma once

// Shared by the codecs (kv_codec.cc) and the attention loaders, which are
// compiled once per instruction set: every function here is `static` (internal
// linkage), so no ISA-specific copy can be merged into another file's callers.
//
// A block of one layer, K or V, holds block_size tokens × num_kv_heads rows of
// head_dim values. Every layout keeps one kv head's data contiguous, codes first
// and that head's metadata right after them, so a loader streams one region:
//
//   block = [num_kv_heads] head regions of head_bytes() each
//   plain (f32, f16, bf16):    region = [block_size, head_dim] elements
//   per token (int8, fp8):     region = [block_size, head_dim] 1-byte codes,
//                                        [block_size] f16 scales
//   per group (int4, KIVI V):  region = [block_size, row_code_bytes] packed codes,
//                                        [block_size, head_dim / group, 2] f16 (scale, min)
//   per channel (KIVI K):      region = [block_size, row_code_bytes] packed codes,
//                                        [head_dim] f16 scales, [head_dim] f16 mins
// Packed codes: value i of a row sits in bits [(i * bits) % 8, + bits) of byte
// i * bits / 8 (low bits first). Decoding: int8 code × scale; fp8 e4m3(code) ×
// scale; grouped and per channel code × scale + min with unsigned codes.
//
// Group size (int4, KIVI V): the largest power of two ≤ 32 dividing head_dim
// (32 for head_dim 64 or 128, 8 for stories260K's 8, 16 for 48). A power of two
// so that every SIMD register (8 or 16 lanes, head_dim a multiple of them)
// lies inside one group.

#include <cstddef>

#include "kv/kv_type.h"

namespace kvlm::kv_format {

enum class Kind {
  kPlain,       // one stored element per value, no metadata
  kTokenScale,  // 8-bit codes, one f16 scale per token per kv head
  kTokenGroup,  // packed codes, f16 (scale, min) per group of a token's row
  kChannel,     // packed codes, f16 scale and min per channel over the block's tokens
};

static constexpr Kind kind(KvType type, KvRole role) {
  switch (type) {
    case KvType::kF32:
    case KvType::kF16:
    case KvType::kBf16:
      return Kind::kPlain;
    case KvType::kFp8:
    case KvType::kInt8:
      return Kind::kTokenScale;
    case KvType::kInt4:
      return Kind::kTokenGroup;
    case KvType::kKivi4:
    case KvType::kKivi2:
      return role == KvRole::kKey ? Kind::kChannel : Kind::kTokenGroup;
  }
  return Kind::kPlain;
}

// Bits per stored value (plain types: the element size).
static constexpr int bits(KvType type) {
  switch (type) {
    case KvType::kF32:
      return 32;
    case KvType::kF16:
    case KvType::kBf16:
      return 16;
    case KvType::kFp8:
    case KvType::kInt8:
      return 8;
    case KvType::kInt4:
    case KvType::kKivi4:
      return 4;
    case KvType::kKivi2:
      return 2;
  }
  return 32;
}

static constexpr int group_size(int head_dim) {
  int g = 32;
  while (g > 1 && head_dim % g != 0) g /= 2;
  return g;
}

static constexpr size_t row_code_bytes(int head_dim, int num_bits) {
  return (static_cast<size_t>(head_dim) * static_cast<size_t>(num_bits) + 7) / 8;
}

// Bytes of a block's codes for one kv head.
static constexpr size_t head_code_bytes(KvType type, int head_dim, int block_size) {
  return static_cast<size_t>(block_size) * row_code_bytes(head_dim, bits(type));
}

// Bytes of one kv head's metadata in a block.
static constexpr size_t head_meta_bytes(KvType type, KvRole role, int head_dim, int block_size) {
  const size_t bs = static_cast<size_t>(block_size);
  const size_t d = static_cast<size_t>(head_dim);
  switch (kind(type, role)) {
    case Kind::kPlain:
      return 0;
    case Kind::kTokenScale:
      return bs * 2;
    case Kind::kTokenGroup:
      return bs * (d / static_cast<size_t>(group_size(head_dim))) * 4;
    case Kind::kChannel:
      return d * 4;
  }
  return 0;
}

static constexpr size_t head_bytes(KvType type, KvRole role, int head_dim, int block_size) {
  return head_code_bytes(type, head_dim, block_size) + head_meta_bytes(type, role, head_dim, block_size);
}

}  // namespace kvlm::kv_format
