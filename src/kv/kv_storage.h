// KvStorage: the KV bytes of every layer, a K and a V arena each (MLA: its latent rows alone), addressed by BlockId.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "core/ids.h"
#include "core/status.h"
#include "kv/kv_codec.h"
#include "kv/kv_layout.h"
#include "kv/kv_type.h"
#include "kv/local_block_map.h"

namespace kvlm {

// Knows no requests: a block id is just an index into each arena, and the same
// id names the same token slots in every layer (one block table serves all
// layers). Block b of layer L's K arena is codec-defined bytes holding
// block_size tokens of [num_kv_heads, head_dim]; for the plain codecs it is
// laid out [num_kv_heads, block_size, head_dim] (see kv_codec.h).
// Arena memory is not zeroed: a slot holds garbage until written.
//
// KIVI blocks and the residual window. A KIVI key block is quantized per
// channel over all of its tokens, so it cannot be encoded token by token. For a
// KIVI type (K, V or both) the storage keeps a block that is being filled in a
// full-precision *staging* buffer, [block_size, num_kv_heads, head_dim] f32 per
// (layer, role), taken from a free list when the block's first token is written.
// write_tokens() (or seal_full_blocks() after write_token) encodes every full block
// of a sequence that lies outside the residual window (the last
// residual_blocks() full blocks, residual_blocks = ceil(kivi_residual_tokens /
// block_size), plus the partial tail block, stay staged) into its compact arena
// block, once, and returns its staging buffer. Attention reads a staged block
// from its f32 rows (k_staged_table) and a sealed one from the arena.
// Writing to a sealed block (a block reused after its sequence was freed, or a
// rewrite) stages it again, first decoding what it held, so a block always
// reads back what was last written or its encoding.
// Memory: the arenas (bytes_per_token(), the compact cost) plus the staging
// buffers held: staging_bytes() now, and at most residual_bytes_per_sequence()
// per sequence (one staging buffer per layer and KIVI role for each residual
// block and the tail). Whoever frees a sequence calls release_blocks() with its
// block table first, so its staged blocks give their buffers back.
// Writes (write_token, seal_*) come from one thread at a time, as the model's
// forward pass makes them; attention only reads.
//
// Rotated keys. A per-token key scale (int8, int4) spends its range on a key's outlier
// channels. With keys_rotated(), the storage rotates every key head it is given by a normalized
// Walsh–Hadamard matrix H (kv/hadamard.h) before encoding it, read_token rotates it back, and
// attention (attention/) rotates its queries the same way before scoring: H is orthogonal, so
// q·k and attention are unchanged while the outliers are spread over the head before
// quantization. Writers (the model) and readers see keys in the model's own space.
//
// Latent rows (MLA, KvLayout::is_latent()). Absorbed multi-head latent attention caches one row
// per token and layer, [normalized latent; rotated RoPE key] (head_dim values, one kv head),
// which attention reads as the key and whose first value_dim() values it reads as the value.
// Only the K arena exists: v_block_bytes() is 0, the byte counts (bytes_per_token,
// bytes_per_block, allocated_bytes, used_bytes) count the row once, and v_arena(), v_block()
// and v_staged_table() hand out the K ones, so a reader asking for V reads the row (its stride
// is k_block_bytes()). The row is encoded by the key codec: v_type must equal k_type, and KIVI
// is refused (it quantizes keys per channel and values per token; a latent row is both).
// Writers pass v == nullptr (a CHECK); read_token's v receives the first value_dim() values of
// the row in the model's space. Copies, compaction and local layers move the row alone.
// Key rotation stays possible when its block, hadamard_block(head_dim), divides value_dim():
// H is block diagonal, so the value part of a rotated row is the rotated value, and attention
// rotates its output back (paged_attention). Otherwise the rotation would mix value and
// non-value channels: rotate_keys = true is a create() error, and the default
// (rotates_keys_by_default) resolves to off, which keys_rotated() reports.
struct KvStorageOptions {
  int kivi_residual_tokens = 0;  // the KIVI residual window, rounded up to whole blocks; ignored for other types
  // Store keys rotated; unset: rotates_keys_by_default(k_type).
  std::optional<bool> rotate_keys = std::nullopt;
  // Sliding-window (local) layers, [num_layers] 1 = local; empty = none. A local layer keeps only
  // the blocks inside some window: its arenas have local_num_blocks slots, which a block holds
  // while it is pinned (pin_local_block) and, retained, until another block needs the slot. See
  // "Sliding-window layers" below.
  std::vector<uint8_t> local_layers = {};
  int local_num_blocks = 0;
};

// int8 and int4 keys (one scale per token, or per group of a token's values) are stored rotated
// unless told otherwise: measured on stories260K, rotation halves int8's KLD against the f32 cache
// (1.7e-3 → 8.1e-4) and cuts int4's by a third. Not fp8: its floating-point codes already keep
// small channels' relative precision beside an outlier, and rotated it measured 3× worse. Not
// KIVI: its per-channel scales are what handles outlier channels, and a rotation would mix the
// channels. Plain types lose nothing to outliers.
constexpr bool rotates_keys_by_default(KvType k_type) {
  return k_type == KvType::kInt8 || k_type == KvType::kInt4;
}

// Sliding-window layers. Global layers address their arenas by block id; local layers address
// a smaller arena through a LocalBlockMap shared by all of them, so their memory is the live
// windows', not the sequences'. Writers and readers still pass block ids (write_token,
// read_token, k_block); attention over a local layer takes the table of local slots
// (local_block_table). Every sequence pins the blocks its window covers (LocalWindowHold does
// the bookkeeping) and unpins them as the window passes or the sequence ends; a block several
// sequences share is pinned by each. An unpinned block keeps its slot, retained, until another
// block needs one (the one unpinned longest ago goes first): a prefix-cache hit can pin it again
// (local_block_cached tells whether its bytes are still there). Writing a local layer's block
// needs a pin (a CHECK). Sizing: local_blocks_per_sequence() per running sequence.
// KIVI staging of a local layer is per slot; a staged block that loses its last pin gives its
// buffer and slot back at once (it is inside the residual window, so never published).
// Block ids past the window keep their global-layer bytes: only the local layers let go.
class KvStorage {
 public:
  // Validates the sizes and allocates; an error (never an abort) for bad or absurd sizes
  // or when the memory cannot be had.
  static Result<std::unique_ptr<KvStorage>> create(const KvLayout& layout, KvType k_type, KvType v_type,
                                                   int num_blocks, const KvStorageOptions& options = {});

  // For sizes already validated: aborts with the same message create() would return.
  KvStorage(const KvLayout& layout, KvType k_type, KvType v_type, int num_blocks,
            const KvStorageOptions& options = {});
  ~KvStorage();
  KvStorage(const KvStorage&) = delete;
  KvStorage& operator=(const KvStorage&) = delete;

  // Encodes one token's K and V into (layer, block, slot) (KIVI roles: into the block's staging buffer).
  //   k, v: [num_kv_heads, head_dim]; latent layout: k is the row, v must be nullptr
  void write_token(int layer, BlockId block, int slot_in_block, const float* k, const float* v);
  // Decodes one token's K and V back to f32 (keys in the model's space: rotated back); v may be
  // nullptr (K only).
  //   k: [num_kv_heads, head_dim]; v: [num_kv_heads, head_dim], latent layout: [value_dim] (the row's prefix)
  void read_token(int layer, BlockId block, int slot_in_block, float* k, float* v) const;
  // Writes one sequence's tokens at positions [first_position, first_position + num_tokens) of
  // `layer` through its block table, and (KIVI) encodes each block as soon as the residual window
  // moves past it, so staging never holds more than the window and the tail, however long the step.
  //   block_table: the sequence's block ids in token order; k, v: [num_tokens, num_kv_heads, head_dim]
  //   (latent layout: k the rows, v nullptr)
  void write_tokens(int layer, std::span<const int32_t> block_table, int64_t first_position, int64_t num_tokens,
                    const float* k, const float* v);

  // After a sequence's tokens [0, num_tokens) have been written to `layer`:
  // encodes its staged full blocks outside the residual window (see above).
  // A no-op (cheap) when neither K nor V is a KIVI type. Walks the table back
  // from the window's edge and stops at the first block that is not staged.
  //   block_table: the sequence's block ids in token order, >= num_tokens / block_size of them
  void seal_full_blocks(int layer, const int32_t* block_table, int num_tokens);
  // Encodes one staged block now (both roles), whatever the window; no-op when not staged.
  void seal_block(int layer, BlockId block);
  bool is_staged(int layer, BlockId block) const;

  // Per arena index (block id; a local layer's slot), the f32 staging rows of a staged block or
  // nullptr when the block is sealed (read it from the arena); the table itself is nullptr when
  // the role is not a KIVI type. Row (slot, kv head) of a staged block starts at
  // staged + (slot * num_kv_heads + kv_head) * head_dim. Latent layouts: v_ is k_ (never KIVI: nullptr).
  const float* const* k_staged_table(int layer) const;  // [num_blocks(layer)]
  const float* const* v_staged_table(int layer) const;  // [num_blocks(layer)]

  int kivi_residual_tokens() const { return options_.kivi_residual_tokens; }
  // Whether keys are stored rotated: KvStorageOptions::rotate_keys, else rotates_keys_by_default,
  // except that a latent layout whose value_dim the rotation block does not divide never rotates
  // (see "Latent rows"). Readers rotate queries with hadamard_rotate_heads.
  bool keys_rotated() const { return keys_rotated_; }
  // Whole blocks of a sequence kept staged besides its partial tail block.
  int residual_blocks() const;
  // The sequence owning these blocks is being freed: their staging buffers go back to the free
  // list unencoded (the contents are dead). No-op for non-KIVI types. Local layers: the pins
  // decide (unpin_local_block).
  void release_blocks(std::span<const int32_t> block_ids);
  // ---- Sliding-window layers (see above) ----
  bool has_local_layers() const { return !options_.local_layers.empty(); }
  bool is_local_layer(int layer) const {
    return has_local_layers() && options_.local_layers[static_cast<size_t>(layer)] != 0;
  }
  int num_local_layers() const { return num_local_layers_; }
  // Entries [first_block, first_block + count) of `block_table` as local slots (-1: none held).
  void local_block_table(std::span<const int32_t> block_table, int first_block, int count, int32_t* out) const;
  // One more pin on the block's local slot (a free one, else the least recently retained, is
  // taken when it has none). False, changing nothing, when every slot is pinned. True without
  // local layers.
  [[nodiscard]] bool pin_local_block(BlockId block);
  // One pin less (a CHECK that it has one); no-op without local layers.
  void unpin_local_block(BlockId block);
  // Whether the block's local-layer bytes are still held (pinned or retained).
  bool local_block_cached(BlockId block) const;
  int local_pins(BlockId block) const;
  int local_blocks_in_use() const { return local_map_.num_pinned(); }  // pinned slots
  int local_blocks_retained() const { return local_map_.num_retained(); }
  int num_local_slots() const { return local_map_.num_slots(); }  // 0 without local layers
  // Slots a pin of an uncached block could take (free or retained).
  int local_slots_unpinned() const { return local_map_.num_slots() - local_map_.num_pinned(); }
  int peak_local_blocks_in_use() const { return local_map_.peak_pinned(); }
  // The most local slots one sequence holds with a window of `window` tokens when no step is
  // longer than max_step_tokens: the window and the step, over whole blocks.
  static int local_blocks_per_sequence(int window, int block_size, int max_step_tokens);

  // Bytes of staging buffers allocated now.
  size_t staging_bytes() const;
  // The most staging bytes one sequence holds: (residual_blocks() + 1) blocks ×
  // layers × KIVI roles × block_size × num_kv_heads × head_dim × 4. Add this per
  // sequence to bytes_per_token() × tokens for a KIVI cache's footprint.
  size_t residual_bytes_per_sequence() const;

  // Copying and moving tokens: copy-on-write of shared blocks (copy_block) and token
  // eviction (copy_token, compact). All of them cover every layer, K and V (a latent layout:
  // its rows). What stays
  // bit-exact (the destination decodes to exactly what the source decoded to):
  //   - copy_block: always, staging included.
  //   - copy_token / compact, per-token codecs (f32, f16, bf16, fp8, int8, int4, and KIVI
  //     values between two sealed blocks): the encoded row and its per-token scale/min are
  //     copied, per kv head.
  //   - copy_token into a staged KIVI destination (any KIVI role where the source or the
  //     destination is staged, and KIVI keys always): the source is decoded to f32 and
  //     written as write_token does (a sealed destination is staged again first). It reads
  //     back exactly until the destination block is sealed; sealing then re-encodes it,
  //     within the codec's bound (kv_codec.h) of what was copied.
  //   - compact, KIVI roles: see there.

  // Makes block dst a copy of block src in every layer, K and V: the encoded bytes and the
  // KIVI staging state (a staged src makes dst staged with a copy of its rows; a sealed src
  // makes a staged dst give its buffer back and take src's encoding). For
  // KvCacheManager::make_block_exclusive's swap, before the caller writes into dst. Local
  // layers copy only when src holds a slot, and dst must be pinned then.
  void copy_block(BlockId src, BlockId dst);
  // Copies one token's K and V, every layer, from (src_block, src_slot) to (dst_block,
  // dst_slot); exact or re-encoded as listed above. The other slots of dst keep their
  // contents. dst must not be shared with another sequence.
  void copy_token(BlockId src_block, int src_slot, BlockId dst_block, int dst_slot);
  // Token eviction's compaction of one sequence: moves token kept_tokens[i] to token index i
  // (block_table[i / block_size], slot i % block_size) in every layer, K and V, so the kept
  // tokens become the sequence's first kept_tokens.size() tokens, in order. kept_tokens
  // are strictly increasing token indices inside the table; tokens that stay put are not
  // touched. The caller then truncates the sequence to kept_tokens.size() tokens
  // (KvCacheManager::truncate) and releases the freed ids (release_blocks).
  // Precondition (the caller's, not checked): every block that receives a token is
  // exclusive to this sequence (make_block_exclusive + copy_block first); blocks after the
  // new end are only read, so they may still be shared.
  // Per-token codecs move rows exactly (as copy_token). KIVI roles are rebuilt block by
  // block as the residual window of the new length wants them: destination blocks outside
  // the window are encoded (keys: re-encoded per channel over their new tokens, within the
  // codec's bound of what the tokens read before; values: their sealed rows copied exactly,
  // staged rows encoded as sealing would); blocks inside the window end up staged and read
  // back exactly what the tokens read before. Afterwards the blocks are as
  // seal_full_blocks(layer, table, kept_tokens.size()) leaves them. The staging this
  // sequence holds never exceeds, per layer and role, the larger of what it held before and
  // residual_blocks() + 1 blocks (so a sequence within residual_bytes_per_sequence() stays
  // within it): for each window block that needs a staging buffer, one staged block after
  // the new end is sealed first, earliest first. Its encoding stays readable for a sequence
  // that shares it; but a shared partial tail block sealed this way encodes its unwritten
  // slots too, which can widen its per-channel key ranges, so the sharer's tail loses some
  // precision (exclusive blocks after the new end are freed by the caller anyway).
  // Temporary memory: up to (residual_blocks() + 1) blocks of f32 per KIVI role.
  // Local layers move only kept tokens [local_first_kept, kept_tokens.size()): the ones later
  // queries' windows still reach (their sources hold slots; the blocks they land in must be
  // pinned). Per-token codecs move them exactly; a KIVI role decodes them, writes them staged
  // and seals what lies outside the residual window. -1: a storage without local layers.
  void compact(std::span<const int32_t> block_table, std::span<const int> kept_tokens, int local_first_kept = -1);

  // Raw encoded blocks for kernels: k_block_bytes() bytes each, layout defined by k_codec().
  // Latent layouts: v_block is k_block (the row holds the value); mutable_v_block is a CHECK.
  const std::byte* k_block(int layer, BlockId block) const;
  const std::byte* v_block(int layer, BlockId block) const;
  std::byte* mutable_k_block(int layer, BlockId block);
  std::byte* mutable_v_block(int layer, BlockId block);
  // Whole arenas, for kernels that compute block addresses themselves:
  // block b starts at k_arena(layer) + b * k_block_bytes(). 64-byte aligned
  // (2 MiB, on huge pages where the OS allows, for arenas of 2 MiB or more).
  // Latent layouts: v_arena is k_arena, with k_block_bytes() per block (v_block_bytes() is 0).
  const std::byte* k_arena(int layer) const;  // [num_blocks, k_block_bytes()]
  const std::byte* v_arena(int layer) const;  // [num_blocks, v_block_bytes()]
  size_t k_block_bytes() const { return k_block_bytes_; }  // one layer, one block, K (or the rows)
  size_t v_block_bytes() const { return v_block_bytes_; }  // one layer, one block, V; 0 for a latent layout

  // K + V bytes one token takes over all layers: 2 × layers × kv_heads × head_dim ×
  // bytes per value for plain types (1 × for a latent layout's rows); for codecs with per-block
  // metadata, the block's bytes spread over its tokens, rounded up. (Local layers hold only
  // their windows' tokens.)
  size_t bytes_per_token() const;
  // K + V bytes of one block id over the global layers (all layers without local ones).
  size_t bytes_per_block() const {
    return (k_block_bytes_ + v_block_bytes_) * static_cast<size_t>(layout_.num_layers - num_local_layers_);
  }
  // K + V bytes of one local slot over the local layers.
  size_t local_bytes_per_block() const {
    return (k_block_bytes_ + v_block_bytes_) * static_cast<size_t>(num_local_layers_);
  }
  // Bytes of all arenas together.
  size_t allocated_bytes() const {
    return bytes_per_block() * static_cast<size_t>(num_blocks_) +
           local_bytes_per_block() * static_cast<size_t>(local_map_.num_slots());
  }
  // Bytes the blocks in use hold: `num_used_blocks` ids in the global layers, and the local slots in use.
  size_t used_bytes(int num_used_blocks) const {
    return bytes_per_block() * static_cast<size_t>(num_used_blocks) +
           local_bytes_per_block() * static_cast<size_t>(local_map_.num_pinned());
  }
  // Blocks the layer's arena holds: num_blocks(), or the local slots of a local layer.
  int num_blocks(int layer) const { return is_local_layer(layer) ? local_map_.num_slots() : num_blocks_; }

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
  Status init(const KvLayout& layout, KvType k_type, KvType v_type, int num_blocks, const KvStorageOptions& options);
  void check_address(int layer, BlockId block) const;
  // Where the block lives in the layer's arenas: its id, or (local layers) its local slot
  // (a CHECK that it holds one; for writing, that it is pinned).
  size_t arena_index(int layer, BlockId block) const;
  size_t writable_arena_index(int layer, BlockId block) const;
  // Whether the layer holds bytes for the block (always, for a global layer).
  bool holds_slot(int layer, BlockId block) const;
  void refuse_local_layers(const char* what) const;

  // One role's (K or V) staging state, for KIVI types only.
  struct Staging {
    bool enabled = false;
    std::vector<std::vector<float*>> block_rows;  // [num_layers][num_blocks(layer)]: staging buffer or nullptr
  };
  // One role (K or V) of the storage, so that copies and compaction handle both alike.
  struct RoleRef {
    Staging* staging;
    const KvCodec* codec;
    std::vector<Arena>* arenas;
    size_t block_bytes;
  };
  RoleRef role(KvRole which);
  // The roles that have bytes: K and V, or a latent layout's K (its rows) alone.
  std::span<const KvRole> stored_roles() const;
  std::byte* encoded(const RoleRef& r, int layer, BlockId block) {
    return (*r.arenas)[static_cast<size_t>(layer)].get() + arena_index(layer, block) * r.block_bytes;
  }
  // The block's staging rows, nullptr when sealed or the role is not staged.
  float* staged_rows(const RoleRef& r, int layer, BlockId block) const;
  // The block's entry in the role's staging table (its rows or nullptr); nullptr when the role
  // is not staged or a local layer holds no slot for the block.
  float** staging_entry(const Staging& staging, int layer, BlockId block) const;
  void compact_local_layer(int layer, std::span<const int32_t> block_table, std::span<const int> kept_tokens,
                           int first_moved, int first_live);
  float* take_staging_buffer();
  // Returns a staged block's buffer to the free list without encoding it.
  void drop_staging(const RoleRef& r, int layer, BlockId block);
  // Decodes one token of one role to f32 (staging rows or arena).  out: [num_kv_heads, head_dim]
  void read_role_token(const RoleRef& r, int layer, BlockId block, int slot, float* out);
  // Copies the encoded row and per-token metadata of every kv head (codecs that encode per token).
  void copy_encoded_row(const RoleRef& r, int layer, BlockId src, int src_slot, BlockId dst, int dst_slot);
  void compact_staged_role(const RoleRef& r, int layer, std::span<const int32_t> block_table,
                           std::span<const int> kept_tokens, int first_moved);
  size_t staging_floats() const { return layout_.values_per_token() * static_cast<size_t>(layout_.block_size); }
  float* stage(Staging& staging, const KvCodec& codec, int layer, BlockId block, std::byte* encoded);
  void seal(Staging& staging, const KvCodec& codec, int layer, BlockId block, std::byte* encoded);

  KvLayout layout_;
  const KvCodec* k_codec_ = nullptr;
  const KvCodec* v_codec_ = nullptr;
  int num_blocks_ = 0;
  size_t k_block_bytes_ = 0;
  size_t v_block_bytes_ = 0;
  std::vector<Arena> k_arenas_;  // [num_layers]
  std::vector<Arena> v_arenas_;  // [num_layers]; empty for a latent layout
  KvStorageOptions options_;
  bool keys_rotated_ = false;  // options_.rotate_keys resolved (keys_rotated())
  int num_local_layers_ = 0;
  LocalBlockMap local_map_;
  std::vector<float> rotated_key_;  // [num_kv_heads, head_dim] write_token's rotated copy
  Staging k_staging_;
  Staging v_staging_;
  std::vector<std::unique_ptr<float[]>> staging_buffers_;  // every buffer ever allocated, [staging_floats()] each
  std::vector<float*> free_staging_;                       // the ones no block holds
};

}  // namespace kvlm
