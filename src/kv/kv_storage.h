// KvStorage: the KV bytes of every layer, one arena per layer for K and one for V, addressed by BlockId.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "core/ids.h"
#include "core/status.h"
#include "kv/kv_codec.h"
#include "kv/kv_layout.h"
#include "kv/kv_type.h"

namespace kvlm {

// Knows no requests: a block id is just an index into each arena, and the same
// id names the same token slots in every layer (one block table serves all
// layers). Block b of layer L's K arena is codec-defined bytes holding
// block_size tokens of [num_kv_heads, head_dim]; for the plain codecs it is
// laid out [num_kv_heads, block_size, head_dim] (see kv_codec.h).
// Arena memory is not zeroed: a slot holds garbage until written.
class KvStorage {
 public:
  // Validates the sizes and allocates; an error (never an abort) for bad or absurd sizes
  // or when the memory cannot be had.
  static Result<std::unique_ptr<KvStorage>> create(const KvLayout& layout, KvType k_type, KvType v_type,
                                                   int num_blocks);

  // For sizes already validated: aborts with the same message create() would return.
  KvStorage(const KvLayout& layout, KvType k_type, KvType v_type, int num_blocks);
  ~KvStorage();
  KvStorage(const KvStorage&) = delete;
  KvStorage& operator=(const KvStorage&) = delete;

  // Encodes one token's K and V into (layer, block, slot).
  //   k, v: [num_kv_heads, head_dim]
  void write_token(int layer, BlockId block, int slot_in_block, const float* k, const float* v);
  // Decodes one token's K and V back to f32.
  //   k, v: [num_kv_heads, head_dim]
  void read_token(int layer, BlockId block, int slot_in_block, float* k, float* v) const;

  // Raw encoded blocks for kernels: k_block_bytes() bytes each, layout defined by k_codec().
  const std::byte* k_block(int layer, BlockId block) const;
  const std::byte* v_block(int layer, BlockId block) const;
  std::byte* mutable_k_block(int layer, BlockId block);
  std::byte* mutable_v_block(int layer, BlockId block);
  // Whole arenas, for kernels that compute block addresses themselves:
  // block b starts at k_arena(layer) + b * k_block_bytes(). 64-byte aligned
  // (2 MiB, on huge pages where the OS allows, for arenas of 2 MiB or more).
  const std::byte* k_arena(int layer) const;  // [num_blocks, k_block_bytes()]
  const std::byte* v_arena(int layer) const;  // [num_blocks, v_block_bytes()]
  size_t k_block_bytes() const { return k_block_bytes_; }  // one layer, one block, K
  size_t v_block_bytes() const { return v_block_bytes_; }  // one layer, one block, V

  // K + V bytes one token takes over all layers: 2 × layers × kv_heads × head_dim ×
  // bytes per value for plain types; for codecs with per-block metadata, the block's
  // bytes spread over its tokens, rounded up.
  size_t bytes_per_token() const;
  // K + V bytes of one block id over all layers.
  size_t bytes_per_block() const { return (k_block_bytes_ + v_block_bytes_) * static_cast<size_t>(layout_.num_layers); }
  // Bytes of all arenas together (num_blocks × bytes_per_block()).
  size_t allocated_bytes() const { return bytes_per_block() * static_cast<size_t>(num_blocks_); }

  int num_blocks() const { return num_blocks_; }
  const KvLayout& layout() const { return layout_; }
  KvType k_type() const { return k_codec_->type(); }
  KvType v_type() const { return v_codec_->type(); }
  const KvCodec& k_codec() const { return *k_codec_; }
  const KvCodec& v_codec() const { return *v_codec_; }

  // Refuses arenas larger than this in total, or than the machine's memory, whichever is smaller.
  static constexpr size_t kMaxAllocatedBytes = size_t{1} << 40;  // 1 TiB

 private:
  struct AlignedFree {
    size_t alignment = 0;  // what the arena was allocated with
    void operator()(std::byte* p) const;
  };
  using Arena = std::unique_ptr<std::byte[], AlignedFree>;

  KvStorage() = default;
  Status init(const KvLayout& layout, KvType k_type, KvType v_type, int num_blocks);
  void check_address(int layer, BlockId block) const;

  KvLayout layout_;
  const KvCodec* k_codec_ = nullptr;
  const KvCodec* v_codec_ = nullptr;
  int num_blocks_ = 0;
  size_t k_block_bytes_ = 0;
  size_t v_block_bytes_ = 0;
  std::vector<Arena> k_arenas_;  // [num_layers]
  std::vector<Arena> v_arenas_;  // [num_layers]
};

}  // namespace kvlm
