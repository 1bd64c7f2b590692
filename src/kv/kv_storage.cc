#include "kv/kv_storage.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include "core/check.h"

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
  layout_ = layout;
  options_ = options;
  k_codec_ = &kv_codec(k_type, KvRole::kKey);
  v_codec_ = &kv_codec(v_type, KvRole::kValue);
  num_blocks_ = num_blocks;

  // Every product is checked: layouts come from model files and flags. Capping the
  // values per block keeps every codec's block_bytes() far from overflowing.
  const auto values = checked_mul(static_cast<size_t>(layout.num_kv_heads), static_cast<size_t>(layout.head_dim));
  const auto block_values = values ? checked_mul(*values, static_cast<size_t>(layout.block_size)) : std::nullopt;
  if (!block_values || *block_values > (size_t{1} << 40)) {
    return Status::errorf("KV block too large: {} kv heads × {} head_dim × {} tokens per block", layout.num_kv_heads,
                          layout.head_dim, layout.block_size);
  }
  k_block_bytes_ = k_codec_->block_bytes(layout);
  v_block_bytes_ = v_codec_->block_bytes(layout);
  const auto per_layer = checked_mul(k_block_bytes_ + v_block_bytes_, static_cast<size_t>(num_blocks));
  const auto total = per_layer ? checked_mul(*per_layer, static_cast<size_t>(layout.num_layers)) : std::nullopt;
  const std::string what = fmt::format(
      "KV storage for {} layers × {} blocks of {} tokens ({} kv heads × {} head_dim, K {} / V {})", layout.num_layers,
      num_blocks, layout.block_size, layout.num_kv_heads, layout.head_dim, kv_type_name(k_type), kv_type_name(v_type));
  if (!total) return Status::errorf("{}: size overflows size_t", what);
  const size_t physical = physical_memory_bytes();
  const size_t limit = physical > 0 ? std::min(kMaxAllocatedBytes, physical) : kMaxAllocatedBytes;
  if (*total > limit) {
    return Status::errorf("{} needs {:.2f} GiB, more than the {:.2f} GiB this machine can give", what, gib(*total),
                          gib(limit));
  }

  k_arenas_.clear();
  v_arenas_.clear();
  k_arenas_.reserve(static_cast<size_t>(layout.num_layers));
  v_arenas_.reserve(static_cast<size_t>(layout.num_layers));
  for (int l = 0; l < layout.num_layers; ++l) {
    for (auto [arenas, bytes] : {std::pair{&k_arenas_, k_block_bytes_ * num_blocks},
                                 std::pair{&v_arenas_, v_block_bytes_ * num_blocks}}) {
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
      staging->block_rows.assign(static_cast<size_t>(layout.num_layers),
                                 std::vector<float*>(static_cast<size_t>(num_blocks), nullptr));
    }
  }
  return Status::ok_status();
}

void KvStorage::check_address(int layer, BlockId block) const {
  KVLM_CHECK(layer >= 0 && layer < layout_.num_layers, "layer {} out of range [0, {})", layer, layout_.num_layers);
  KVLM_CHECK(block.value >= 0 && block.value < num_blocks_, "block {} out of range [0, {})", block.value,
             num_blocks_);
}

void KvStorage::write_token(int layer, BlockId block, int slot_in_block, const float* k, const float* v) {
  check_address(layer, block);
  KVLM_CHECK(slot_in_block >= 0 && slot_in_block < layout_.block_size, "slot {} out of range [0, {})",
             slot_in_block, layout_.block_size);
  const size_t width = layout_.values_per_token();
  const size_t offset = static_cast<size_t>(slot_in_block) * width;
  if (k_staging_.enabled) {
    float* rows = stage(k_staging_, *k_codec_, layer, block, mutable_k_block(layer, block));
    std::copy(k, k + width, rows + offset);
  } else {
    k_codec_->encode_token(layout_, k, mutable_k_block(layer, block), slot_in_block);
  }
  if (v_staging_.enabled) {
    float* rows = stage(v_staging_, *v_codec_, layer, block, mutable_v_block(layer, block));
    std::copy(v, v + width, rows + offset);
  } else {
    v_codec_->encode_token(layout_, v, mutable_v_block(layer, block), slot_in_block);
  }
}

float* KvStorage::stage(Staging& staging, const KvCodec& codec, int layer, BlockId block, std::byte* encoded) {
  float*& rows = staging.block_rows[static_cast<size_t>(layer)][static_cast<size_t>(block.value)];
  if (rows != nullptr) return rows;
  if (free_staging_.empty()) {
    staging_buffers_.push_back(std::make_unique<float[]>(staging_floats()));
    free_staging_.push_back(staging_buffers_.back().get());
  }
  rows = free_staging_.back();
  free_staging_.pop_back();
  // The block may hold tokens already (a rewrite): keep them readable.
  const size_t width = layout_.values_per_token();
  for (int slot = 0; slot < layout_.block_size; ++slot) {
    codec.decode_token(layout_, encoded, slot, rows + static_cast<size_t>(slot) * width);
  }
  return rows;
}

void KvStorage::seal(Staging& staging, const KvCodec& codec, int layer, BlockId block, std::byte* encoded) {
  if (!staging.enabled) return;
  float*& rows = staging.block_rows[static_cast<size_t>(layer)][static_cast<size_t>(block.value)];
  if (rows == nullptr) return;
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
                k + static_cast<size_t>(i) * width, v + static_cast<size_t>(i) * width);
    // A block just filled: the window moved by one block, so the block that left it is encoded.
    if ((position + 1) % block_size == 0) seal_full_blocks(layer, block_table.data(), static_cast<int>(position + 1));
  }
}

void KvStorage::release_blocks(std::span<const int32_t> block_ids) {
  for (Staging* staging : {&k_staging_, &v_staging_}) {
    if (!staging->enabled) continue;
    for (int layer = 0; layer < layout_.num_layers; ++layer) {
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
  seal(k_staging_, *k_codec_, layer, block, mutable_k_block(layer, block));
  seal(v_staging_, *v_codec_, layer, block, mutable_v_block(layer, block));
}

bool KvStorage::is_staged(int layer, BlockId block) const {
  check_address(layer, block);
  for (const Staging* staging : {&k_staging_, &v_staging_}) {
    if (staging->enabled &&
        staging->block_rows[static_cast<size_t>(layer)][static_cast<size_t>(block.value)] != nullptr) {
      return true;
    }
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
  const float* k_rows = k_staging_.enabled ? k_staged_table(layer)[block.value] : nullptr;
  const float* v_rows = v_staging_.enabled ? v_staged_table(layer)[block.value] : nullptr;
  if (k_rows != nullptr) {
    std::copy(k_rows + offset, k_rows + offset + width, k);
  } else {
    k_codec_->decode_token(layout_, k_block(layer, block), slot_in_block, k);
  }
  if (v_rows != nullptr) {
    std::copy(v_rows + offset, v_rows + offset + width, v);
  } else {
    v_codec_->decode_token(layout_, v_block(layer, block), slot_in_block, v);
  }
}

const std::byte* KvStorage::k_block(int layer, BlockId block) const {
  check_address(layer, block);
  return k_arenas_[static_cast<size_t>(layer)].get() + static_cast<size_t>(block.value) * k_block_bytes_;
}

const std::byte* KvStorage::v_block(int layer, BlockId block) const {
  check_address(layer, block);
  return v_arenas_[static_cast<size_t>(layer)].get() + static_cast<size_t>(block.value) * v_block_bytes_;
}

std::byte* KvStorage::mutable_k_block(int layer, BlockId block) {
  return const_cast<std::byte*>(static_cast<const KvStorage*>(this)->k_block(layer, block));
}

std::byte* KvStorage::mutable_v_block(int layer, BlockId block) {
  return const_cast<std::byte*>(static_cast<const KvStorage*>(this)->v_block(layer, block));
}

const std::byte* KvStorage::k_arena(int layer) const {
  KVLM_CHECK(layer >= 0 && layer < layout_.num_layers, "layer {} out of range [0, {})", layer, layout_.num_layers);
  return k_arenas_[static_cast<size_t>(layer)].get();
}

const std::byte* KvStorage::v_arena(int layer) const {
  KVLM_CHECK(layer >= 0 && layer < layout_.num_layers, "layer {} out of range [0, {})", layer, layout_.num_layers);
  return v_arenas_[static_cast<size_t>(layer)].get();
}

size_t KvStorage::bytes_per_token() const {
  const size_t bs = static_cast<size_t>(layout_.block_size);
  return (bytes_per_block() + bs - 1) / bs;
}

}  // namespace kvlm
