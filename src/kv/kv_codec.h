// KvCodec: how one layer's K (or V) values of one block are laid out and encoded.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kv/kv_layout.h"
#include "kv/kv_type.h"

namespace kvlm {

// A codec owns the byte layout of a block: KvStorage only knows how many bytes a
// block takes and hands the block's bytes to the codec. The cache bookkeeping
// never sees codecs at all, so new codecs (bf16, fp8, int8 per token, int4 per
// group, KIVI) change nothing outside kv/ and the attention loaders.
//
// Attention kernels do not call these virtual functions per value: they dispatch
// on type() once per call and read blocks through a loader type that knows the
// same layout and decodes in registers (attention/attention_kernel_impl.h and
// the paged_attention_<isa>.cc files: one loader per codec and ISA).
// encode_token/decode_token are the slow, obviously correct path for writes,
// tests and debugging.
//
// Codecs whose encoding spans a whole block (KIVI keys per channel) will encode
// a block when its last slot is written; until then the tail block keeps full
// precision. The interface is per token so that such codecs can still accept
// one token at a time.
class KvCodec {
 public:
  virtual ~KvCodec() = default;

  virtual KvType type() const = 0;

  // Bytes of one block of one layer, K or V: block_size tokens of [num_kv_heads, head_dim].
  virtual size_t block_bytes(const KvLayout& layout) const = 0;

  // Encodes one token's vector into slot `slot` of `block`.
  //   src: [num_kv_heads, head_dim]; block: block_bytes(layout) bytes.
  virtual void encode_token(const KvLayout& layout, const float* src, std::byte* block, int slot) const = 0;

  // Decodes slot `slot` of `block` to f32.
  //   dst: [num_kv_heads, head_dim]
  virtual void decode_token(const KvLayout& layout, const std::byte* block, int slot, float* dst) const = 0;
};

// The codec for a type; codecs are stateless singletons that live for the whole program.
const KvCodec& kv_codec(KvType type);

// Plain codecs (f32, f16: one stored element per value, no metadata) lay a block
// out as [num_kv_heads, block_size, head_dim], so the rows one kv head reads
// during attention are contiguous inside a block.
// Element index of (kv head, slot)'s row inside a block of a plain codec.
inline size_t plain_row_index(const KvLayout& layout, int kv_head, int slot) {
  return (static_cast<size_t>(kv_head) * static_cast<size_t>(layout.block_size) + static_cast<size_t>(slot)) *
         static_cast<size_t>(layout.head_dim);
}

}  // namespace kvlm
