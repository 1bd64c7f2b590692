#include "kv/kv_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "kv/kv_block_format.h"

namespace kvlm {
namespace {

using kv_format::Kind;

float f16_round(float x) { return fp16_to_fp32(fp32_to_fp16(x)); }

void store_f16(std::byte* p, float x) {
  const uint16_t h = fp32_to_fp16(x);
  std::memcpy(p, &h, sizeof h);
}

float load_f16(const std::byte* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return fp16_to_fp32(h);
}

// Packed unsigned codes of `bits` bits (kv_block_format.h).
void set_code(uint8_t* row, int i, int bits, uint32_t code) {
  const int bit = i * bits;
  uint8_t& byte = row[bit / 8];
  const int shift = bit % 8;
  const uint32_t mask = ((1u << bits) - 1u) << shift;
  byte = static_cast<uint8_t>((byte & ~mask) | ((code << shift) & mask));
}

uint32_t get_code(const uint8_t* row, int i, int bits) {
  const int bit = i * bits;
  return (row[bit / 8] >> (bit % 8)) & ((1u << bits) - 1u);
}

// Largest finite f16, so that huge values saturate instead of storing inf scales.
constexpr float kMaxF16 = 65504.0f;

// One codec per (type, role), driven by the layout arithmetic in kv_block_format.h.
class BlockCodec final : public KvCodec {
 public:
  BlockCodec(KvType type, KvRole role)
      : type_(type), role_(role), kind_(kv_format::kind(type, role)), bits_(kv_format::bits(type)) {}

  KvType type() const override { return type_; }
  KvRole role() const override { return role_; }
  bool encodes_whole_blocks() const override { return kind_ == Kind::kChannel; }

  size_t block_bytes(const KvLayout& layout) const override {
    return static_cast<size_t>(layout.num_kv_heads) * head_bytes(layout);
  }

  void encode_token(const KvLayout& layout, const float* src, std::byte* block, int slot) const override {
    KVLM_CHECK(kind_ != Kind::kChannel, "{} keys are encoded a block at a time (encode_block)", kv_type_name(type_));
    for (int h = 0; h < layout.num_kv_heads; ++h) {
      encode_row(layout, src + static_cast<size_t>(h) * layout.head_dim, block, h, slot);
    }
  }

  void encode_block(const KvLayout& layout, const float* src, std::byte* block) const override {
    if (kind_ != Kind::kChannel) {
      KvCodec::encode_block(layout, src, block);
      return;
    }
    const size_t width = layout.values_per_token();
    const int D = layout.head_dim;
    const float levels = static_cast<float>((1 << bits_) - 1);
    for (int h = 0; h < layout.num_kv_heads; ++h) {
      std::byte* region = block + static_cast<size_t>(h) * head_bytes(layout);
      uint8_t* codes = reinterpret_cast<uint8_t*>(region);
      std::byte* scales = region + kv_format::head_code_bytes(type_, D, layout.block_size);
      std::byte* mins = scales + 2 * static_cast<size_t>(D);
      const size_t row_bytes = kv_format::row_code_bytes(D, bits_);
      for (int d = 0; d < D; ++d) {
        float lo = INFINITY, hi = -INFINITY;
        for (int t = 0; t < layout.block_size; ++t) {
          const float x = src[t * width + static_cast<size_t>(h) * D + d];
          lo = std::min(lo, x);
          hi = std::max(hi, x);
        }
        const float mn = f16_round(std::clamp(lo, -kMaxF16, kMaxF16));
        const float s = f16_round(std::min((hi - mn) / levels, kMaxF16));
        store_f16(scales + 2 * d, s);
        store_f16(mins + 2 * d, mn);
        for (int t = 0; t < layout.block_size; ++t) {
          const float x = src[t * width + static_cast<size_t>(h) * D + d];
          set_code(codes + t * row_bytes, d, bits_, quantize_unsigned(x, mn, s, levels));
        }
      }
    }
  }

  void decode_token(const KvLayout& layout, const std::byte* block, int slot, float* dst) const override {
    const int D = layout.head_dim;
    for (int h = 0; h < layout.num_kv_heads; ++h) {
      const std::byte* region = block + static_cast<size_t>(h) * head_bytes(layout);
      float* out = dst + static_cast<size_t>(h) * D;
      const size_t row_bytes = kv_format::row_code_bytes(D, bits_);
      const uint8_t* codes = reinterpret_cast<const uint8_t*>(region) + static_cast<size_t>(slot) * row_bytes;
      const std::byte* meta = region + kv_format::head_code_bytes(type_, D, layout.block_size);
      switch (kind_) {
        case Kind::kPlain: {
          const size_t e = static_cast<size_t>(bits_ / 8);
          const std::byte* row = region + static_cast<size_t>(slot) * D * e;
          for (int d = 0; d < D; ++d) out[d] = load_plain(row + d * e);
          break;
        }
        case Kind::kTokenScale: {
          const float s = load_f16(meta + 2 * static_cast<size_t>(slot));
          for (int d = 0; d < D; ++d) {
            out[d] = type_ == KvType::kInt8 ? static_cast<float>(static_cast<int8_t>(codes[d])) * s
                                            : fp8_e4m3_to_fp32(codes[d]) * s;
          }
          break;
        }
        case Kind::kTokenGroup: {
          const int g = kv_format::group_size(D);
          const std::byte* m = meta + static_cast<size_t>(slot) * (D / g) * 4;
          for (int d = 0; d < D; ++d) {
            const float s = load_f16(m + (d / g) * 4), mn = load_f16(m + (d / g) * 4 + 2);
            out[d] = static_cast<float>(get_code(codes, d, bits_)) * s + mn;
          }
          break;
        }
        case Kind::kChannel: {
          const std::byte* mins = meta + 2 * static_cast<size_t>(D);
          for (int d = 0; d < D; ++d) {
            out[d] = static_cast<float>(get_code(codes, d, bits_)) * load_f16(meta + 2 * d) + load_f16(mins + 2 * d);
          }
          break;
        }
      }
    }
  }

 private:
  size_t head_bytes(const KvLayout& layout) const {
    return kv_format::head_bytes(type_, role_, layout.head_dim, layout.block_size);
  }

  // Written so that a NaN input saturates to a code instead of reaching a float-to-int cast.
  static uint32_t quantize_unsigned(float x, float mn, float s, float levels) {
    if (!(s > 0.0f)) return 0;
    const float q = std::nearbyint((x - mn) / s);
    return q >= 0.0f ? static_cast<uint32_t>(std::min(q, levels)) : 0u;
  }

  float load_plain(const std::byte* p) const {
    switch (type_) {
      case KvType::kF32: {
        float x;
        std::memcpy(&x, p, sizeof x);
        return x;
      }
      case KvType::kF16:
        return load_f16(p);
      default: {
        uint16_t h;
        std::memcpy(&h, p, sizeof h);
        return bf16_to_fp32(h);
      }
    }
  }

  void store_plain(std::byte* p, float x) const {
    switch (type_) {
      case KvType::kF32:
        std::memcpy(p, &x, sizeof x);
        return;
      case KvType::kF16:
        store_f16(p, x);
        return;
      default: {
        const uint16_t h = fp32_to_bf16(x);
        std::memcpy(p, &h, sizeof h);
        return;
      }
    }
  }

  // Encodes one kv head's row of one token (every kind but kChannel).
  void encode_row(const KvLayout& layout, const float* x, std::byte* block, int h, int slot) const {
    const int D = layout.head_dim;
    std::byte* region = block + static_cast<size_t>(h) * head_bytes(layout);
    const size_t row_bytes = kv_format::row_code_bytes(D, bits_);
    uint8_t* codes = reinterpret_cast<uint8_t*>(region) + static_cast<size_t>(slot) * row_bytes;
    std::byte* meta = region + kv_format::head_code_bytes(type_, D, layout.block_size);
    switch (kind_) {
      case Kind::kPlain: {
        const size_t e = static_cast<size_t>(bits_ / 8);
        std::byte* row = region + static_cast<size_t>(slot) * D * e;
        for (int d = 0; d < D; ++d) store_plain(row + d * e, x[d]);
        return;
      }
      case Kind::kTokenScale: {
        float amax = 0.0f;
        for (int d = 0; d < D; ++d) amax = std::max(amax, std::fabs(x[d]));
        const float limit = type_ == KvType::kInt8 ? 127.0f : 448.0f;
        const float s = f16_round(std::min(amax / limit, kMaxF16));
        store_f16(meta + 2 * static_cast<size_t>(slot), s);
        for (int d = 0; d < D; ++d) {
          if (!(s > 0.0f)) {
            codes[d] = 0;
          } else if (type_ == KvType::kInt8) {
            const float q = std::nearbyint(x[d] / s);
            codes[d] = static_cast<uint8_t>(static_cast<int8_t>(q >= -127.0f ? std::min(q, 127.0f) : -127.0f));
          } else {
            codes[d] = fp8_e4m3_from_fp32(x[d] / s);
          }
        }
        return;
      }
      case Kind::kTokenGroup: {
        const int g = kv_format::group_size(D);
        const float levels = static_cast<float>((1 << bits_) - 1);
        std::byte* m = meta + static_cast<size_t>(slot) * (D / g) * 4;
        for (int g0 = 0; g0 < D; g0 += g) {
          float lo = INFINITY, hi = -INFINITY;
          for (int d = g0; d < g0 + g; ++d) {
            lo = std::min(lo, x[d]);
            hi = std::max(hi, x[d]);
          }
          const float mn = f16_round(std::clamp(lo, -kMaxF16, kMaxF16));
          const float s = f16_round(std::min((hi - mn) / levels, kMaxF16));
          store_f16(m + (g0 / g) * 4, s);
          store_f16(m + (g0 / g) * 4 + 2, mn);
          for (int d = g0; d < g0 + g; ++d) set_code(codes, d, bits_, quantize_unsigned(x[d], mn, s, levels));
        }
        return;
      }
      case Kind::kChannel:
        break;
    }
    KVLM_CHECK(false, "encode_row on a per-channel codec");
  }

  KvType type_;
  KvRole role_;
  Kind kind_;
  int bits_;
};

}  // namespace

void KvCodec::encode_block(const KvLayout& layout, const float* src, std::byte* block) const {
  const size_t width = layout.values_per_token();
  for (int t = 0; t < layout.block_size; ++t) encode_token(layout, src + t * width, block, t);
}

const KvCodec& kv_codec(KvType type, KvRole role) {
  static const std::vector<BlockCodec> codecs = [] {
    std::vector<BlockCodec> all;
    for (KvType t : all_kv_types()) {
      all.emplace_back(t, KvRole::kKey);
      all.emplace_back(t, KvRole::kValue);
    }
    return all;
  }();
  for (const BlockCodec& c : codecs) {
    if (c.type() == type && c.role() == role) return c;
  }
  KVLM_CHECK(false, "no codec for KvType {}", static_cast<int>(type));
  return codecs.front();
}

size_t kv_block_bytes(const KvLayout& layout, KvType k_type, KvType v_type) {
  const size_t k = kv_codec(k_type, KvRole::kKey).block_bytes(layout);
  return layout.is_latent() ? k : k + kv_codec(v_type, KvRole::kValue).block_bytes(layout);
}

uint8_t fp8_e4m3_from_fp32(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  float a = std::fabs(x);
  if (std::isnan(a)) return 0x7f;
  if (a >= 448.0f) return sign | 0x7e;  // saturate: 0x7e is 448
  // Round to the E4M3 grid: quantum 2^(e-3) in binade [2^e, 2^(e+1)), 2^-9 below 2^-6.
  int e;
  std::frexp(a, &e);  // a = f × 2^e with f in [0.5, 1)
  const int exp2 = std::max(e - 1, -6);
  const float quantum = std::ldexp(1.0f, exp2 - 3);
  a = std::min(std::nearbyint(a / quantum) * quantum, 448.0f);
  // a / 256 is exactly an f16 whose bits, shifted right by 7, are E4M3's (see fp8_e4m3_to_fp32).
  return static_cast<uint8_t>(sign | ((fp32_to_fp16(a / 256.0f) >> 7) & 0x7f));
}

float fp8_e4m3_to_fp32(uint8_t code) {
  // E4M3's exponent and mantissa, moved into f16's fields, are the f16 of value / 256:
  // both normal (2^(E-7) vs 2^(E-15)) and subnormal (2^-6 vs 2^-14) scale by 2^8.
  const uint16_t h = static_cast<uint16_t>(((code & 0x80u) << 8) | ((code & 0x7fu) << 7));
  return fp16_to_fp32(h) * 256.0f;
}

}  // namespace kvlm
