#include "kv/kv_storage.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include "core/check.h"
#include "kv/hadamard.h"
#include "kv/kv_block_format.h"

namespace kvlm {
namespace {

constexpr size_t kArenaAlignment = 64;  // a cache line: SIMD rows never straddle one needlessly
// Arenas of at least a huge page are aligned to one and advised to use huge
// pages: attention reads blocks scattered over the arena, and with 4 KiB pages
// every block costs TLB misses.
constexpr size_t kHugePageBytes = size_t{2} << 20;

size_t arena_alignment(size_t bytes) { return bytes >= kHugePageBytes ? kHugePageBytes : kArenaAlignment; }

// Physical memory of the machine, or 0 when unknown.
size_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<size_t>(pages) * static_cast<size_t>(page_size);
}

// a * b, or nullopt on overflow.
std::optional<size_t> checked_mul(size_t a, size_t b) {
  size_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

double gib(size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0); }

}  // namespace

void KvStorage::AlignedFree::operator()(std::byte* p) const {
  ::operator delete[](p, std::align_val_t{alignment});
}

Result<std::unique_ptr<KvStorage>> KvStorage::create(const KvLayout& layout, KvType k_type, KvType v_type,
                                                     int num_blocks, const KvStorageOptions& options) {
  std::unique_ptr<KvStorage> storage(new KvStorage());
  KVLM_RETURN_IF_ERROR(storage->init(layout, k_type, v_type, num_blocks, options));
  return storage;
}

KvStorage::KvStorage(const KvLayout& layout, KvType k_type, KvType v_type, int num_blocks,
                     const KvStorageOptions& options) {
  const Status status = init(layout, k_type, v_type, num_blocks, options);
  KVLM_CHECK(status.ok(), "{}", status.message());
}

KvStorage::~KvStorage() = default;

Status KvStorage::init(const KvLayout& layout, KvType k_type, KvType v_type, int num_blocks,
                       const KvStorageOptions& options) {
  KVLM_RETURN_IF_ERROR(validate_kv_layout(layout));
  if (num_blocks <= 0) return Status::errorf("KV storage needs at least one block, got num_blocks={}", num_blocks);
  if (options.kivi_residual_tokens < 0) {
    return Status::errorf("KIVI residual window must be >= 0 tokens, got {}", options.kivi_residual_tokens);
  }
  const bool latent = layout.is_latent();
  if (latent && v_type != k_type) {
    return Status::errorf(
        "a latent KV layout stores one row per token, read as the key and (its first {} values) as the value: "
        "V type {} must equal K type {}",
        layout.latent_value_dim, kv_type_name(v_type), kv_type_name(k_type));
  }
  if (latent && is_kivi(k_type)) {
    return Status::errorf(
        "KV type {} is not supported for a latent KV layout: KIVI quantizes keys per channel and values per token, "
        "and a latent row is both",
        kv_type_name(k_type));
  }
  // The rotation is block diagonal: the value (a prefix of the row) stays a rotated value only
  // when whole blocks make it up.
  const int rotation_block = hadamard_block(layout.head_dim);
  const bool rotation_fits = !latent || layout.latent_value_dim % rotation_block == 0;
  if (options.rotate_keys.value_or(false) && !rotation_fits) {
    return Status::errorf(
        "key rotation works in blocks of {} values (the largest power of two dividing head_dim {}), which do not "
        "divide the latent value_dim {}: rotated rows would mix value and key-only channels; turn rotation off",
        rotation_block, layout.head_dim, layout.latent_value_dim);
  }
  layout_ = layout;
  options_ = options;
  keys_rotated_ = rotation_fits && options.rotate_keys.value_or(rotates_keys_by_default(k_type));
  k_codec_ = &kv_codec(k_type, KvRole::kKey);
  v_codec_ = &kv_codec(v_type, KvRole::kValue);
  num_blocks_ = num_blocks;
  num_local_layers_ = 0;
  if (!options.local_layers.empty()) {
    if (static_cast<int>(options.local_layers.size()) != layout.num_layers) {
      return Status::errorf("KV storage: {} local-layer flags for {} layers", options.local_layers.size(),
                            layout.num_layers);
    }
    num_local_layers_ = static_cast<int>(std::count(options.local_layers.begin(), options.local_layers.end(), 1));
    if (num_local_layers_ == 0) options_.local_layers.clear();  // all global: nothing local to keep
  }
  if (num_local_layers_ > 0) {
    if (options.local_num_blocks <= 0) {
      return Status::errorf("KV storage: {} sliding-window layers need local blocks, got local_num_blocks={}",
                            num_local_layers_, options.local_num_blocks);
    }
  }
  const int local_slots = num_local_layers_ > 0 ? options.local_num_blocks : 0;

  // Every product is checked: layouts come from model files and flags. Capping the
  // values per block keeps every codec's block_bytes() far from overflowing.
  const auto values = checked_mul(static_cast<size_t>(layout.num_kv_heads), static_cast<size_t>(layout.head_dim));
  const auto block_values = values ? checked_mul(*values, static_cast<size_t>(layout.block_size)) : std::nullopt;
  if (!block_values || *block_values > (size_t{1} << 40)) {
    return Status::errorf("KV block too large: {} kv heads × {} head_dim × {} tokens per block", layout.num_kv_heads,
                          layout.head_dim, layout.block_size);
  }
  k_block_bytes_ = k_codec_->block_bytes(layout);
  v_block_bytes_ = latent ? 0 : v_codec_->block_bytes(layout);  // a latent layout's value is in its rows
  const auto per_layer = checked_mul(k_block_bytes_ + v_block_bytes_, static_cast<size_t>(num_blocks));
  const auto global = per_layer ? checked_mul(*per_layer, static_cast<size_t>(layout.num_layers - num_local_layers_))
                                : std::nullopt;
  const auto per_local_layer =
      checked_mul(k_block_bytes_ + v_block_bytes_, static_cast<size_t>(local_slots));
  const auto local =
      per_local_layer ? checked_mul(*per_local_layer, static_cast<size_t>(num_local_layers_)) : std::nullopt;
  const std::optional<size_t> total =
      global && local && *global + *local >= *global ? std::optional<size_t>(*global + *local) : std::nullopt;
  const std::string rows =
      latent ? fmt::format("latent rows of {} values, {}", layout.head_dim, kv_type_name(k_type))
             : fmt::format("{} kv heads × {} head_dim, K {} / V {}", layout.num_kv_heads, layout.head_dim,
                           kv_type_name(k_type), kv_type_name(v_type));
  const std::string what = fmt::format("KV storage for {} layers × {} blocks of {} tokens ({})", layout.num_layers,
                                       num_blocks, layout.block_size, rows);
  if (!total) return Status::errorf("{}: size overflows size_t", what);
  const size_t physical = physical_memory_bytes();
  const size_t limit = physical > 0 ? std::min(kMaxAllocatedBytes, physical) : kMaxAllocatedBytes;
  if (*total > limit) {
    return Status::errorf("{} needs {:.2f} GiB, more than the {:.2f} GiB this machine can give", what, gib(*total),
                          gib(limit));
  }

  // Only now the block map: it holds 4 bytes per block id, so an absurd num_blocks (2^30) would
  // cost gigabytes and seconds before the error above.
  local_map_ = LocalBlockMap(num_blocks, local_slots);

  k_arenas_.clear();
  v_arenas_.clear();
  k_arenas_.reserve(static_cast<size_t>(layout.num_layers));
  v_arenas_.reserve(static_cast<size_t>(layout.num_layers));
  for (int l = 0; l < layout.num_layers; ++l) {
    const size_t blocks = static_cast<size_t>(this->num_blocks(l));
    for (auto [arenas, bytes] :
         {std::pair{&k_arenas_, k_block_bytes_ * blocks}, std::pair{&v_arenas_, v_block_bytes_ * blocks}}) {
      if (arenas == &v_arenas_ && latent) continue;  // no V arena
      const size_t alignment = arena_alignment(bytes);
      auto* p = static_cast<std::byte*>(::operator new[](bytes, std::align_val_t{alignment}, std::nothrow));
      if (p == nullptr) {
        k_arenas_.clear();
        v_arenas_.clear();
        return Status::errorf("{}: out of memory allocating {:.2f} GiB per arena ({:.2f} GiB in all)", what,
                              gib(bytes), gib(*total));
      }
      if (alignment == kHugePageBytes) madvise(p, bytes, MADV_HUGEPAGE);  // a hint: failure changes nothing
      arenas->emplace_back(p, AlignedFree{alignment});
    }
  }
  for (auto [staging, type] : {std::pair{&k_staging_, k_type}, std::pair{&v_staging_, v_type}}) {
    staging->enabled = is_kivi(type);
    staging->block_rows.clear();
    if (staging->enabled) {
      // Indexed like the layer's arena: block ids, or a local layer's slots.
      staging->block_rows.resize(static_cast<size_t>(layout.num_layers));
      for (int l = 0; l < layout.num_layers; ++l) {
        staging->block_rows[static_cast<size_t>(l)].assign(static_cast<size_t>(this->num_blocks(l)), nullptr);
      }
    }
  }
  return Status::ok_status();
}

void KvStorage::check_address(int layer, BlockId block) const {
  KVLM_CHECK(layer >= 0 && layer < layout_.num_layers, "layer {} out of range [0, {})", layer, layout_.num_layers);
  KVLM_CHECK(block.value >= 0 && block.value < num_blocks_, "block {} out of range [0, {})", block.value,
             num_blocks_);
}

size_t KvStorage::arena_index(int layer, BlockId block) const {
  if (!is_local_layer(layer)) return static_cast<size_t>(block.value);
  const int32_t slot = local_map_.slot(block.value);
  KVLM_CHECK(slot >= 0, "block {} holds no slot in local layer {}: it left every window or was never pinned",
             block.value, layer);
  return static_cast<size_t>(slot);
}

size_t KvStorage::writable_arena_index(int layer, BlockId block) const {
  KVLM_CHECK(!is_local_layer(layer) || local_map_.pins(block.value) > 0,
             "block {} is written in local layer {} without a pin (LocalWindowHold)", block.value, layer);
  return arena_index(layer, block);
}

bool KvStorage::holds_slot(int layer, BlockId block) const {
  return !is_local_layer(layer) || local_map_.slot(block.value) >= 0;
}

float** KvStorage::staging_entry(const Staging& staging, int layer, BlockId block) const {
  if (!staging.enabled || !holds_slot(layer, block)) return nullptr;
  auto& rows = const_cast<Staging&>(staging).block_rows[static_cast<size_t>(layer)];
  return &rows[arena_index(layer, block)];
}

bool KvStorage::pin_local_block(BlockId block) {
  if (!has_local_layers()) return true;
  check_address(0, block);
  // A retained slot was never staged (unpin_local_block), so taking it loses no buffer.
  return local_map_.pin(block.value);
}

void KvStorage::unpin_local_block(BlockId block) {
  if (!has_local_layers()) return;
  check_address(0, block);
  local_map_.unpin(block.value);
  if (local_map_.pins(block.value) > 0) return;
  // A block still staged is in the KIVI residual window: never published (its bytes are not
  // final), so no hit can want it. Its buffer goes back and the slot is free at once.
  bool staged = false;
  for (Staging* staging : {&k_staging_, &v_staging_}) {
    if (!staging->enabled) continue;
    for (int layer = 0; layer < layout_.num_layers; ++layer) {
      if (!is_local_layer(layer)) continue;
      float** entry = staging_entry(*staging, layer, block);
      if (*entry == nullptr) continue;
      free_staging_.push_back(*entry);
      *entry = nullptr;
      staged = true;
    }
  }
  if (staged) local_map_.free_slot(block.value);
}

bool KvStorage::local_block_cached(BlockId block) const {
  check_address(0, block);
  return has_local_layers() && local_map_.slot(block.value) >= 0;
}

int KvStorage::local_pins(BlockId block) const {
  check_address(0, block);
  return has_local_layers() ? local_map_.pins(block.value) : 0;
}

void KvStorage::refuse_local_layers(const char* what) const {
  KVLM_CHECK(!has_local_layers(), "{} is not supported on a storage with sliding-window layers", what);
}

void KvStorage::local_block_table(std::span<const int32_t> block_table, int first_block, int count,
                                  int32_t* out) const {
  KVLM_CHECK(first_block >= 0 && first_block + count <= static_cast<int>(block_table.size()),
             "local_block_table: entries [{}, {}) of a {}-block table", first_block, first_block + count,
             block_table.size());
  for (int i = 0; i < count; ++i) {
    const int32_t id = block_table[static_cast<size_t>(first_block + i)];
    check_address(0, BlockId(id));
    out[i] = local_map_.slot(id);
  }
}

int KvStorage::local_blocks_per_sequence(int window, int block_size, int max_step_tokens) {
  // The step's first query sees window - 1 earlier tokens; the span may straddle one more block.
  const int64_t span = static_cast<int64_t>(window) - 1 + std::max(1, max_step_tokens);
  return static_cast<int>((span + block_size - 1) / block_size) + 1;
}

void KvStorage::write_token(int layer, BlockId block, int slot_in_block, const float* k, const float* v) {
  check_address(layer, block);
  KVLM_CHECK(slot_in_block >= 0 && slot_in_block < layout_.block_size, "slot {} out of range [0, {})",
             slot_in_block, layout_.block_size);
  const bool latent = layout_.is_latent();
  KVLM_CHECK(latent == (v == nullptr), "write_token: {} (layer {}, block {}, slot {})",
             latent ? "a latent layout stores no V: v must be nullptr" : "no V given", layer, block.value,
             slot_in_block);
  const size_t width = layout_.values_per_token();
  const size_t offset = static_cast<size_t>(slot_in_block) * width;
  if (keys_rotated()) {
    rotated_key_.assign(k, k + width);
    hadamard_rotate_heads(rotated_key_.data(), layout_.num_kv_heads, layout_.head_dim);
    k = rotated_key_.data();
  }
  if (k_staging_.enabled) {
    float* rows = stage(k_staging_, *k_codec_, layer, block, mutable_k_block(layer, block));
    std::copy(k, k + width, rows + offset);
  } else {
    k_codec_->encode_token(layout_, k, mutable_k_block(layer, block), slot_in_block);
  }
  if (latent) return;
  if (v_staging_.enabled) {
    float* rows = stage(v_staging_, *v_codec_, layer, block, mutable_v_block(layer, block));
    std::copy(v, v + width, rows + offset);
  } else {
    v_codec_->encode_token(layout_, v, mutable_v_block(layer, block), slot_in_block);
  }
}

float* KvStorage::stage(Staging& staging, const KvCodec& codec, int layer, BlockId block, std::byte* encoded) {
  float*& rows = *staging_entry(staging, layer, block);
  if (rows != nullptr) return rows;
  rows = take_staging_buffer();
  // The block may hold tokens already (a rewrite): keep them readable.
  const size_t width = layout_.values_per_token();
  for (int slot = 0; slot < layout_.block_size; ++slot) {
    codec.decode_token(layout_, encoded, slot, rows + static_cast<size_t>(slot) * width);
  }
  return rows;
}

void KvStorage::seal(Staging& staging, const KvCodec& codec, int layer, BlockId block, std::byte* encoded) {
  float** entry = staging_entry(staging, layer, block);
  if (entry == nullptr || *entry == nullptr) return;
  float*& rows = *entry;
  codec.encode_block(layout_, rows, encoded);
  free_staging_.push_back(rows);
  rows = nullptr;
}

void KvStorage::write_tokens(int layer, std::span<const int32_t> block_table, int64_t first_position,
                             int64_t num_tokens, const float* k, const float* v) {
  const int64_t block_size = layout_.block_size;
  const size_t width = layout_.values_per_token();
  for (int64_t i = 0; i < num_tokens; ++i) {
    const int64_t position = first_position + i;
    const size_t index = static_cast<size_t>(position / block_size);
    KVLM_CHECK(index < block_table.size(), "position {} is past the block table's {} blocks", position,
               block_table.size());
    write_token(layer, BlockId(block_table[index]), static_cast<int>(position % block_size),
                k + static_cast<size_t>(i) * width, v != nullptr ? v + static_cast<size_t>(i) * width : nullptr);
    // A block just filled: the window moved by one block, so the block that left it is encoded.
    if ((position + 1) % block_size == 0) seal_full_blocks(layer, block_table.data(), static_cast<int>(position + 1));
  }
}

void KvStorage::release_blocks(std::span<const int32_t> block_ids) {
  for (Staging* staging : {&k_staging_, &v_staging_}) {
    if (!staging->enabled) continue;
    for (int layer = 0; layer < layout_.num_layers; ++layer) {
      if (is_local_layer(layer)) continue;  // the pins decide (unpin_local_block)
      for (int32_t id : block_ids) {
        check_address(layer, BlockId(id));
        float*& rows = staging->block_rows[static_cast<size_t>(layer)][static_cast<size_t>(id)];
        if (rows == nullptr) continue;
        free_staging_.push_back(rows);
        rows = nullptr;
      }
    }
  }
}

void KvStorage::seal_block(int layer, BlockId block) {
  check_address(layer, block);
  if (!is_staged(layer, block)) return;
  seal(k_staging_, *k_codec_, layer, block, mutable_k_block(layer, block));
  if (!layout_.is_latent()) seal(v_staging_, *v_codec_, layer, block, mutable_v_block(layer, block));
}

bool KvStorage::is_staged(int layer, BlockId block) const {
  check_address(layer, block);
  for (const Staging* staging : {&k_staging_, &v_staging_}) {
    float** entry = staging_entry(*staging, layer, block);
    if (entry != nullptr && *entry != nullptr) return true;
  }
  return false;
}

void KvStorage::seal_full_blocks(int layer, const int32_t* block_table, int num_tokens) {
  if (!k_staging_.enabled && !v_staging_.enabled) return;
  KVLM_CHECK(num_tokens >= 0, "seal_full_blocks: num_tokens {} < 0", num_tokens);
  const int num_sealable = num_tokens / layout_.block_size - residual_blocks();
  for (int i = num_sealable - 1; i >= 0; --i) {
    const BlockId block(block_table[i]);
    if (!is_staged(layer, block)) break;  // everything before it was sealed by earlier calls
    seal_block(layer, block);
  }
}

const float* const* KvStorage::k_staged_table(int layer) const {
  check_address(layer, BlockId(0));
  return k_staging_.enabled ? k_staging_.block_rows[static_cast<size_t>(layer)].data() : nullptr;
}

const float* const* KvStorage::v_staged_table(int layer) const {
  if (layout_.is_latent()) return k_staged_table(layer);
  check_address(layer, BlockId(0));
  return v_staging_.enabled ? v_staging_.block_rows[static_cast<size_t>(layer)].data() : nullptr;
}

int KvStorage::residual_blocks() const {
  return (options_.kivi_residual_tokens + layout_.block_size - 1) / layout_.block_size;
}

size_t KvStorage::staging_bytes() const { return staging_buffers_.size() * staging_floats() * sizeof(float); }

size_t KvStorage::residual_bytes_per_sequence() const {
  const size_t roles = (k_staging_.enabled ? 1 : 0) + (v_staging_.enabled ? 1 : 0);
  return static_cast<size_t>(residual_blocks() + 1) * static_cast<size_t>(layout_.num_layers) * roles *
         staging_floats() * sizeof(float);
}

void KvStorage::read_token(int layer, BlockId block, int slot_in_block, float* k, float* v) const {
  check_address(layer, block);
  KVLM_CHECK(slot_in_block >= 0 && slot_in_block < layout_.block_size, "slot {} out of range [0, {})",
             slot_in_block, layout_.block_size);
  const size_t width = layout_.values_per_token();
  const size_t offset = static_cast<size_t>(slot_in_block) * width;
  float** k_entry = staging_entry(k_staging_, layer, block);
  float** v_entry = staging_entry(v_staging_, layer, block);
  const float* k_rows = k_entry != nullptr ? *k_entry : nullptr;
  const float* v_rows = v_entry != nullptr ? *v_entry : nullptr;
  if (k_rows != nullptr) {
    std::copy(k_rows + offset, k_rows + offset + width, k);
  } else {
    k_codec_->decode_token(layout_, k_block(layer, block), slot_in_block, k);
  }
  if (keys_rotated()) hadamard_rotate_heads(k, layout_.num_kv_heads, layout_.head_dim);  // H is its own inverse
  if (v == nullptr) return;
  if (layout_.is_latent()) {
    std::copy(k, k + layout_.value_dim(), v);  // the value is the row's prefix, in the model's space
  } else if (v_rows != nullptr) {
    std::copy(v_rows + offset, v_rows + offset + width, v);
  } else {
    v_codec_->decode_token(layout_, v_block(layer, block), slot_in_block, v);
  }
}

const std::byte* KvStorage::k_block(int layer, BlockId block) const {
  check_address(layer, block);
  return k_arenas_[static_cast<size_t>(layer)].get() + arena_index(layer, block) * k_block_bytes_;
}

const std::byte* KvStorage::v_block(int layer, BlockId block) const {
  if (layout_.is_latent()) return k_block(layer, block);
  check_address(layer, block);
  return v_arenas_[static_cast<size_t>(layer)].get() + arena_index(layer, block) * v_block_bytes_;
}

// Writers: a local layer's block must be pinned.
std::byte* KvStorage::mutable_k_block(int layer, BlockId block) {
  check_address(layer, block);
  return k_arenas_[static_cast<size_t>(layer)].get() + writable_arena_index(layer, block) * k_block_bytes_;
}

std::byte* KvStorage::mutable_v_block(int layer, BlockId block) {
  KVLM_CHECK(!layout_.is_latent(), "mutable_v_block: a latent layout has no V arena (layer {}, block {})", layer,
             block.value);
  check_address(layer, block);
  return v_arenas_[static_cast<size_t>(layer)].get() + writable_arena_index(layer, block) * v_block_bytes_;
}

const std::byte* KvStorage::k_arena(int layer) const {
  KVLM_CHECK(layer >= 0 && layer < layout_.num_layers, "layer {} out of range [0, {})", layer, layout_.num_layers);
  return k_arenas_[static_cast<size_t>(layer)].get();
}

const std::byte* KvStorage::v_arena(int layer) const {
  if (layout_.is_latent()) return k_arena(layer);
  KVLM_CHECK(layer >= 0 && layer < layout_.num_layers, "layer {} out of range [0, {})", layer, layout_.num_layers);
  return v_arenas_[static_cast<size_t>(layer)].get();
}

size_t KvStorage::bytes_per_token() const {
  const size_t bs = static_cast<size_t>(layout_.block_size);
  return (bytes_per_block() + local_bytes_per_block() + bs - 1) / bs;
}

// ---- Copies and compaction ----

KvStorage::RoleRef KvStorage::role(KvRole which) {
  if (which == KvRole::kKey) return RoleRef{&k_staging_, k_codec_, &k_arenas_, k_block_bytes_};
  KVLM_CHECK(!layout_.is_latent(), "a latent layout stores no V role");
  return RoleRef{&v_staging_, v_codec_, &v_arenas_, v_block_bytes_};
}

std::span<const KvRole> KvStorage::stored_roles() const {
  static constexpr KvRole kRoles[] = {KvRole::kKey, KvRole::kValue};
  return {kRoles, layout_.is_latent() ? size_t{1} : size_t{2}};
}

float* KvStorage::staged_rows(const RoleRef& r, int layer, BlockId block) const {
  float** entry = staging_entry(*r.staging, layer, block);
  return entry != nullptr ? *entry : nullptr;
}

float* KvStorage::take_staging_buffer() {
  if (free_staging_.empty()) {
    staging_buffers_.push_back(std::make_unique<float[]>(staging_floats()));
    free_staging_.push_back(staging_buffers_.back().get());
  }
  float* rows = free_staging_.back();
  free_staging_.pop_back();
  return rows;
}

void KvStorage::drop_staging(const RoleRef& r, int layer, BlockId block) {
  float** entry = staging_entry(*r.staging, layer, block);
  if (entry == nullptr || *entry == nullptr) return;
  float*& rows = *entry;
  free_staging_.push_back(rows);
  rows = nullptr;
}

void KvStorage::read_role_token(const RoleRef& r, int layer, BlockId block, int slot, float* out) {
  const size_t width = layout_.values_per_token();
  if (const float* rows = staged_rows(r, layer, block)) {
    const float* row = rows + static_cast<size_t>(slot) * width;
    std::copy(row, row + width, out);
  } else {
    r.codec->decode_token(layout_, encoded(r, layer, block), slot, out);
  }
}

void KvStorage::copy_encoded_row(const RoleRef& r, int layer, BlockId src, int src_slot, BlockId dst,
                                 int dst_slot) {
  const KvType type = r.codec->type();
  const KvRole which = r.codec->role();
  KVLM_CHECK(!r.codec->encodes_whole_blocks(), "{} {} rows cannot be copied alone", kv_type_name(type),
             which == KvRole::kKey ? "key" : "value");
  const int dim = layout_.head_dim;
  const int bs = layout_.block_size;
  // Per kv head region (kv_block_format.h): [block_size] rows of codes, then [block_size]
  // per-token metadata records (none for plain types).
  const size_t head = kv_format::head_bytes(type, which, dim, bs);
  const size_t codes = kv_format::head_code_bytes(type, dim, bs);
  const size_t row = kv_format::row_code_bytes(dim, kv_format::bits(type));
  const size_t meta = kv_format::head_meta_bytes(type, which, dim, bs) / static_cast<size_t>(bs);
  const std::byte* s = encoded(r, layer, src);
  std::byte* d = encoded(r, layer, dst);
  const size_t ss = static_cast<size_t>(src_slot), ds = static_cast<size_t>(dst_slot);
  for (size_t h = 0; h < static_cast<size_t>(layout_.num_kv_heads); ++h) {
    std::memmove(d + h * head + ds * row, s + h * head + ss * row, row);
    if (meta > 0) std::memmove(d + h * head + codes + ds * meta, s + h * head + codes + ss * meta, meta);
  }
}

void KvStorage::copy_block(BlockId src, BlockId dst) {
  check_address(0, src);
  check_address(0, dst);
  if (src == dst) return;
  for (KvRole which : stored_roles()) {
    const RoleRef r = role(which);
    for (int layer = 0; layer < layout_.num_layers; ++layer) {
      // A local layer keeps src only inside some window; dst then needs its pin (the caller's).
      if (!holds_slot(layer, src)) continue;
      if (is_local_layer(layer)) writable_arena_index(layer, dst);
      std::memcpy(encoded(r, layer, dst), encoded(r, layer, src), r.block_bytes);
      if (!r.staging->enabled) continue;
      const float* src_rows = staged_rows(r, layer, src);
      if (src_rows == nullptr) {
        drop_staging(r, layer, dst);  // dst now reads src's encoding
        continue;
      }
      float*& dst_rows = *staging_entry(*r.staging, layer, dst);
      if (dst_rows == nullptr) dst_rows = take_staging_buffer();
      std::copy(src_rows, src_rows + staging_floats(), dst_rows);
    }
  }
}

void KvStorage::copy_token(BlockId src_block, int src_slot, BlockId dst_block, int dst_slot) {
  refuse_local_layers("copy_token (token eviction)");
  check_address(0, src_block);
  check_address(0, dst_block);
  const int bs = layout_.block_size;
  KVLM_CHECK(src_slot >= 0 && src_slot < bs && dst_slot >= 0 && dst_slot < bs,
             "copy_token slots {} -> {} out of range [0, {})", src_slot, dst_slot, bs);
  if (src_block == dst_block && src_slot == dst_slot) return;
  std::vector<float> token;  // [num_kv_heads, head_dim], only for the staged path
  for (KvRole which : stored_roles()) {
    const RoleRef r = role(which);
    for (int layer = 0; layer < layout_.num_layers; ++layer) {
      const bool staged = staged_rows(r, layer, src_block) != nullptr || staged_rows(r, layer, dst_block) != nullptr;
      if (!r.codec->encodes_whole_blocks() && !staged) {
        copy_encoded_row(r, layer, src_block, src_slot, dst_block, dst_slot);
        continue;
      }
      token.resize(layout_.values_per_token());
      read_role_token(r, layer, src_block, src_slot, token.data());
      float* rows = stage(*r.staging, *r.codec, layer, dst_block, encoded(r, layer, dst_block));
      std::copy(token.begin(), token.end(), rows + static_cast<size_t>(dst_slot) * token.size());
    }
  }
}

void KvStorage::compact(std::span<const int32_t> block_table, std::span<const int> kept_tokens,
                        int local_first_kept) {
  KVLM_CHECK(!has_local_layers() || (local_first_kept >= 0 && local_first_kept <= static_cast<int>(kept_tokens.size())),
             "compact: local_first_kept {} outside [0, {}] on a storage with sliding-window layers", local_first_kept,
             kept_tokens.size());
  const int bs = layout_.block_size;
  const int64_t capacity = static_cast<int64_t>(block_table.size()) * bs;
  const int num_kept = static_cast<int>(kept_tokens.size());
  int first_moved = num_kept;
  for (int i = 0; i < num_kept; ++i) {
    const int t = kept_tokens[static_cast<size_t>(i)];
    KVLM_CHECK(t >= 0 && t < capacity, "compact: kept token {} (#{}) outside the table's {} slots", t, i, capacity);
    KVLM_CHECK(i == 0 || t > kept_tokens[static_cast<size_t>(i) - 1],
               "compact: kept tokens must be strictly increasing, #{} is {} after {}", i, t,
               kept_tokens[static_cast<size_t>(i) - 1]);
    if (t != i && first_moved == num_kept) first_moved = i;
  }
  for (int32_t id : block_table) check_address(0, BlockId(id));
  for (int layer = 0; layer < layout_.num_layers; ++layer) {
    if (is_local_layer(layer)) compact_local_layer(layer, block_table, kept_tokens, first_moved, local_first_kept);
  }
  for (KvRole which : stored_roles()) {
    const RoleRef r = role(which);
    for (int layer = 0; layer < layout_.num_layers; ++layer) {
      if (is_local_layer(layer)) continue;
      if (r.staging->enabled) {
        compact_staged_role(r, layer, block_table, kept_tokens, first_moved);
        // A no-op after compact_staged_role; it states the state the blocks must be in.
        seal_full_blocks(layer, block_table.data(), num_kept);
        continue;
      }
      // kept[i] >= i, and every later source lies after slot i, so moving in increasing i
      // never overwrites a token that is still to be moved.
      for (int i = first_moved; i < num_kept; ++i) {
        const int t = kept_tokens[static_cast<size_t>(i)];
        copy_encoded_row(r, layer, BlockId(block_table[static_cast<size_t>(t / bs)]), t % bs,
                         BlockId(block_table[static_cast<size_t>(i / bs)]), i % bs);
      }
    }
  }
}

// One KIVI role of one layer. With n = kept_tokens.size(), the residual window of the new
// length wants blocks [0, sealed_end) sealed and [sealed_end, num_blocks) staged. Token i's
// source lies in block kept[i] / bs >= i / bs, so destination blocks can be filled in
// increasing order, each from itself and later blocks only.
void KvStorage::compact_staged_role(const RoleRef& r, int layer, std::span<const int32_t> block_table,
                                    std::span<const int> kept_tokens, int first_moved) {
  const int bs = layout_.block_size;
  const size_t width = layout_.values_per_token();
  const int num_kept = static_cast<int>(kept_tokens.size());
  const int num_blocks = (num_kept + bs - 1) / bs;
  const int sealed_end = std::max(0, num_kept / bs - residual_blocks());
  // Blocks before it keep every token in place; past it every kept token moves (kept is
  // strictly increasing, so once kept[i] > i, kept[i'] > i' for every later i').
  const int first_block = first_moved == num_kept ? num_blocks : first_moved / bs;
  auto block = [&](int idx) { return BlockId(block_table[static_cast<size_t>(idx)]); };
  auto source = [&](int i) { return kept_tokens[static_cast<size_t>(i)]; };

  // Untouched blocks that the shorter window leaves behind: sealed as seal_full_blocks would.
  for (int j = 0; j < std::min(first_block, sealed_end); ++j) {
    seal(*r.staging, *r.codec, layer, block(j), encoded(r, layer, block(j)));
  }

  // Blocks outside the new window: every slot holds a kept token (j < n / bs).
  std::vector<float> scratch;
  for (int j = first_block; j < sealed_end; ++j) {
    const BlockId dst = block(j);
    if (r.codec->encodes_whole_blocks()) {
      // Keys: per channel over the block, so the block is encoded anew from its tokens' f32.
      scratch.resize(staging_floats());
      for (int slot = 0; slot < bs; ++slot) {
        const int t = source(j * bs + slot);
        read_role_token(r, layer, block(t / bs), t % bs, scratch.data() + static_cast<size_t>(slot) * width);
      }
      r.codec->encode_block(layout_, scratch.data(), encoded(r, layer, dst));
      drop_staging(r, layer, dst);
      continue;
    }
    // Values: per token. Into a staged block (not left by seal_full_blocks, but possible)
    // write the rows and seal; into a sealed one copy sealed rows exactly and encode staged
    // ones as sealing their block would.
    float* dst_rows = staged_rows(r, layer, dst);
    for (int slot = 0; slot < bs; ++slot) {
      const int i = j * bs + slot;
      const int t = source(i);
      if (t == i) continue;
      const BlockId src = block(t / bs);
      const float* src_rows = staged_rows(r, layer, src);
      if (dst_rows != nullptr) {
        read_role_token(r, layer, src, t % bs, dst_rows + static_cast<size_t>(slot) * width);
      } else if (src_rows != nullptr) {
        r.codec->encode_token(layout_, src_rows + static_cast<size_t>(t % bs) * width, encoded(r, layer, dst), slot);
      } else {
        copy_encoded_row(r, layer, src, t % bs, dst, slot);
      }
    }
    if (dst_rows != nullptr) seal(*r.staging, *r.codec, layer, dst, encoded(r, layer, dst));
  }

  // Blocks inside the new window end staged. Gather all their tokens first, so that staged
  // blocks after the new end (sources) can give their buffers back before these take theirs.
  const int first_window = std::max(first_block, sealed_end);
  if (first_window >= num_blocks) return;
  scratch.assign(static_cast<size_t>(num_blocks - first_window) * staging_floats(), 0.0f);
  int num_new_buffers = 0;
  for (int j = first_window; j < num_blocks; ++j) {
    float* out = scratch.data() + static_cast<size_t>(j - first_window) * staging_floats();
    for (int slot = 0; slot < bs; ++slot) {
      const int i = j * bs + slot;
      // Slots past the new end keep what they hold, as a rewrite of a sealed block does.
      const int t = i < num_kept ? source(i) : i;
      read_role_token(r, layer, block(t / bs), t % bs, out + static_cast<size_t>(slot) * width);
    }
    num_new_buffers += staged_rows(r, layer, block(j)) == nullptr ? 1 : 0;
  }
  // As many staged blocks after the new end give their buffers back as the window takes,
  // earliest first: a partial tail block, which would encode its unwritten slots too, last.
  for (size_t idx = static_cast<size_t>(num_blocks); idx < block_table.size() && num_new_buffers > 0; ++idx) {
    const BlockId b(block_table[idx]);
    if (staged_rows(r, layer, b) == nullptr) continue;
    seal(*r.staging, *r.codec, layer, b, encoded(r, layer, b));
    --num_new_buffers;
  }
  for (int j = first_window; j < num_blocks; ++j) {
    float*& rows = *staging_entry(*r.staging, layer, block(j));
    if (rows == nullptr) rows = take_staging_buffer();
    const float* in = scratch.data() + static_cast<size_t>(j - first_window) * staging_floats();
    std::copy(in, in + staging_floats(), rows);
  }
}

// A local layer keeps only what later windows reach: kept tokens [first_live, n) (those from
// first_moved on move) into blocks the caller pinned; everything before is outside every
// window to come.
void KvStorage::compact_local_layer(int layer, std::span<const int32_t> block_table, std::span<const int> kept_tokens,
                                    int first_moved, int first_live) {
  const int bs = layout_.block_size;
  const int from = std::max(first_moved, first_live);
  const int num_kept = static_cast<int>(kept_tokens.size());
  const size_t width = layout_.values_per_token();
  auto block = [&](int token) { return BlockId(block_table[static_cast<size_t>(token / bs)]); };
  for (int i = from; i < num_kept; ++i) writable_arena_index(layer, block(i));  // the destinations are pinned
  bool any_staged = false;
  std::vector<float> gathered;
  for (KvRole which : stored_roles()) {
    const RoleRef r = role(which);
    if (!r.staging->enabled) {
      // In increasing i, as for a global layer: no source is overwritten before it moves.
      for (int i = from; i < num_kept; ++i) {
        const int t = kept_tokens[static_cast<size_t>(i)];
        if (t != i) copy_encoded_row(r, layer, block(t), t % bs, block(i), i % bs);
      }
      continue;
    }
    // KIVI: every source first (a destination block may be a later token's source), then the
    // rows into staged destinations; sealing below encodes those outside the residual window.
    any_staged = true;
    gathered.resize(static_cast<size_t>(std::max(0, num_kept - from)) * width);
    for (int i = from; i < num_kept; ++i) {
      const int t = kept_tokens[static_cast<size_t>(i)];
      read_role_token(r, layer, block(t), t % bs, gathered.data() + static_cast<size_t>(i - from) * width);
    }
    for (int i = from; i < num_kept; ++i) {
      const BlockId dst = block(i);
      float* rows = stage(*r.staging, *r.codec, layer, dst, encoded(r, layer, dst));
      const float* row = gathered.data() + static_cast<size_t>(i - from) * width;
      std::copy(row, row + width, rows + static_cast<size_t>(i % bs) * width);
    }
    // The first live block's slots before first_live hold dead bytes (a reclaimed slot's, or
    // never written): a per-channel key encoding would spend its range on them. They are never
    // read, so they take a copy of the first live row.
    if (first_live < num_kept && first_live % bs != 0) {
      if (float* rows = staged_rows(r, layer, block(first_live))) {
        const float* live = rows + static_cast<size_t>(first_live % bs) * width;
        for (int s = 0; s < first_live % bs; ++s) std::copy(live, live + width, rows + static_cast<size_t>(s) * width);
      }
    }
  }
  if (any_staged) seal_full_blocks(layer, block_table.data(), num_kept);
}

}  // namespace kvlm
