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
                                                     int num_blocks) {
  std::unique_ptr<KvStorage> storage(new KvStorage());
  KVLM_RETURN_IF_ERROR(storage->init(layout, k_type, v_type, num_blocks));
  return storage;
}

KvStorage::KvStorage(const KvLayout& layout, KvType k_type, KvType v_type, int num_blocks) {
  const Status status = init(layout, k_type, v_type, num_blocks);
  KVLM_CHECK(status.ok(), "{}", status.message());
}

KvStorage::~KvStorage() = default;

Status KvStorage::init(const KvLayout& layout, KvType k_type, KvType v_type, int num_blocks) {
  KVLM_RETURN_IF_ERROR(validate_kv_layout(layout));
  if (num_blocks <= 0) return Status::errorf("KV storage needs at least one block, got num_blocks={}", num_blocks);
  layout_ = layout;
  k_codec_ = &kv_codec(k_type);
  v_codec_ = &kv_codec(v_type);
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
  k_codec_->encode_token(layout_, k, mutable_k_block(layer, block), slot_in_block);
  v_codec_->encode_token(layout_, v, mutable_v_block(layer, block), slot_in_block);
}

void KvStorage::read_token(int layer, BlockId block, int slot_in_block, float* k, float* v) const {
  check_address(layer, block);
  KVLM_CHECK(slot_in_block >= 0 && slot_in_block < layout_.block_size, "slot {} out of range [0, {})",
             slot_in_block, layout_.block_size);
  k_codec_->decode_token(layout_, k_block(layer, block), slot_in_block, k);
  v_codec_->decode_token(layout_, v_block(layer, block), slot_in_block, v);
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
