// KvCodec: how one layer's K (or V) values of one block are laid out and encoded.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kv/kv_layout.h"
#include "kv/kv_type.h"

namespace kvlm {

// A codec owns the byte layout of a block (written out in kv_block_format.h):
// KvStorage only knows how many bytes a block takes and hands the block's bytes
// to the codec. The cache bookkeeping never sees codecs at all.
//
// Attention kernels do not call these virtual functions per value: they dispatch
// on type() once per call and read blocks through a loader type that knows the
// same layout and decodes in registers (attention/attention_kernel_impl.h and
// the paged_attention_<isa>.cc files: one loader per codec and ISA).
// encode_token/decode_token are the slow, obviously correct path for writes,
// tests and debugging.
//
// Codecs and their error bounds (s = the stored f16 scale, per token and kv head
// unless said otherwise; values are rounded to nearest):
//   f32   exact.            f16, bf16   relative 2^-11, 2^-8.
//   int8  code in [-127, 127], s = amax / 127: |error| ≤ s / 2.
//   fp8   E4M3 (no inf; saturates at ±448), s = amax / 448: relative 2^-4 for
//         |x| ≥ 2^-6 s, else absolute 2^-10 s.
//   int4  per group of kv_format::group_size(head_dim) values: min and
//         s = (max - min) / 15, code in [0, 15]: |error| ≤ s / 2 (+ the f16
//         rounding of min and s).
//   kivi4/kivi2, role kKey: per channel (each of head_dim) over the block's
//         tokens, min and s = (max - min) / (2^bits - 1); role kValue: as int4 per
//         group, with 4 or 2 bits. KIVI keys need every token of the block, so
//         encodes_whole_blocks() is true: KvStorage stages such blocks in f32 and
//         calls encode_block once the block is full (kv_storage.h).
class KvCodec {
 public:
  virtual ~KvCodec() = default;

  virtual KvType type() const = 0;
  virtual KvRole role() const = 0;

  // Bytes of one block of one layer, K or V: block_size tokens of [num_kv_heads, head_dim],
  // including every scale and min.
  virtual size_t block_bytes(const KvLayout& layout) const = 0;

  // True when a token cannot be encoded alone (KIVI keys): use encode_block.
  virtual bool encodes_whole_blocks() const { return false; }

  // Encodes one token's vector into slot `slot` of `block`, leaving other slots alone.
  // Not for codecs that encode whole blocks (a CHECK).
  //   src: [num_kv_heads, head_dim]; block: block_bytes(layout) bytes.
  virtual void encode_token(const KvLayout& layout, const float* src, std::byte* block, int slot) const = 0;

  // Encodes a whole block.
  //   src: [block_size, num_kv_heads, head_dim]
  virtual void encode_block(const KvLayout& layout, const float* src, std::byte* block) const;

  // Decodes slot `slot` of `block` to f32.
  //   dst: [num_kv_heads, head_dim]
  virtual void decode_token(const KvLayout& layout, const std::byte* block, int slot, float* dst) const = 0;
};

// The codec for a type and role; codecs are stateless singletons that live for the
// whole program. Only KIVI differs by role, so kv_codec(type) (the key codec)
// serves every other type for both.
const KvCodec& kv_codec(KvType type, KvRole role = KvRole::kKey);

// K + V bytes of one block of one layer: what the planner multiplies by layers. A latent layout
// stores only its rows: the K bytes (v_type is not used).
size_t kv_block_bytes(const KvLayout& layout, KvType k_type, KvType v_type);

// FP8 E4M3 (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; no infinities):
// round to nearest even, saturating at ±448. Only a NaN input gives 0x7f/0xff (E4M3's
// NaN), which the decoder here and in the kernels, a pure bit move, reads as ±480.
uint8_t fp8_e4m3_from_fp32(float x);
float fp8_e4m3_to_fp32(uint8_t code);

// Plain codecs (f32, f16, bf16: one stored element per value, no metadata) lay a
// block out as [num_kv_heads, block_size, head_dim], so the rows one kv head reads
// during attention are contiguous inside a block.
// Element index of (kv head, slot)'s row inside a block of a plain codec.
inline size_t plain_row_index(const KvLayout& layout, int kv_head, int slot) {
  return (static_cast<size_t>(kv_head) * static_cast<size_t>(layout.block_size) + static_cast<size_t>(slot)) *
         static_cast<size_t>(layout.head_dim);
}

}  // namespace kvlm
