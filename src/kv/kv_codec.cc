#include "kv/kv_codec.h"

#include <cstring>

#include "core/check.h"
#include "core/dtype.h"

namespace kvlm {
namespace {

// f32 values stored as they are.
class F32Codec final : public KvCodec {
 public:
  KvType type() const override { return KvType::kF32; }

  size_t block_bytes(const KvLayout& layout) const override {
    return static_cast<size_t>(layout.block_size) * layout.values_per_token() * sizeof(float);
  }

  void encode_token(const KvLayout& layout, const float* src, std::byte* block, int slot) const override {
    float* values = reinterpret_cast<float*>(block);
    for (int h = 0; h < layout.num_kv_heads; ++h) {
      std::memcpy(values + plain_row_index(layout, h, slot), src + static_cast<size_t>(h) * layout.head_dim,
                  sizeof(float) * layout.head_dim);
    }
  }

  void decode_token(const KvLayout& layout, const std::byte* block, int slot, float* dst) const override {
    const float* values = reinterpret_cast<const float*>(block);
    for (int h = 0; h < layout.num_kv_heads; ++h) {
      std::memcpy(dst + static_cast<size_t>(h) * layout.head_dim, values + plain_row_index(layout, h, slot),
                  sizeof(float) * layout.head_dim);
    }
  }
};

// IEEE half, round to nearest even on encode.
class F16Codec final : public KvCodec {
 public:
  KvType type() const override { return KvType::kF16; }

  size_t block_bytes(const KvLayout& layout) const override {
    return static_cast<size_t>(layout.block_size) * layout.values_per_token() * sizeof(uint16_t);
  }

  void encode_token(const KvLayout& layout, const float* src, std::byte* block, int slot) const override {
    uint16_t* values = reinterpret_cast<uint16_t*>(block);
    for (int h = 0; h < layout.num_kv_heads; ++h) {
      uint16_t* row = values + plain_row_index(layout, h, slot);
      const float* in = src + static_cast<size_t>(h) * layout.head_dim;
      for (int d = 0; d < layout.head_dim; ++d) row[d] = fp32_to_fp16(in[d]);
    }
  }

  void decode_token(const KvLayout& layout, const std::byte* block, int slot, float* dst) const override {
    const uint16_t* values = reinterpret_cast<const uint16_t*>(block);
    for (int h = 0; h < layout.num_kv_heads; ++h) {
      const uint16_t* row = values + plain_row_index(layout, h, slot);
      float* out = dst + static_cast<size_t>(h) * layout.head_dim;
      for (int d = 0; d < layout.head_dim; ++d) out[d] = fp16_to_fp32(row[d]);
    }
  }
};

}  // namespace

const KvCodec& kv_codec(KvType type) {
  static const F32Codec f32;
  static const F16Codec f16;
  switch (type) {
    case KvType::kF32:
      return f32;
    case KvType::kF16:
      return f16;
  }
  KVLM_CHECK(false, "no codec for KvType {}", static_cast<int>(type));
  return f32;
}

}  // namespace kvlm
