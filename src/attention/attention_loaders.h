// Internal to attention/: how the kernels read K/V rows of each codec from a block (loaders),
// the constants and small helpers they share, and the scalar integer q·k forms.
#pragma once

// Included through attention_kernel_impl.h by exactly one .cc per instruction set; everything
// here has internal linkage (see there).

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "attention/attention_kernel.h"
#include "attention/query_rounding.h"
#include "kv/kv_block_format.h"
#include "kv/kv_layout.h"
#include "kv/kv_type.h"

namespace kvlm::attention_internal {
namespace {

inline constexpr int kMaxRowBlock = 8;   // (query, head) rows sharing one pass over a K/V tile
// Blocks sit at random places in the arena, where no hardware prefetcher looks, so the kernels
// prefetch K/V rows in two steps: into L2 kPrefetchFarTiles tiles ahead, then into L1 the tile
// after the one computing. A core keeps only a few L1 misses in flight, each stalling it once
// they are all taken; the far step keeps DRAM busy through L2's deeper queue (f16 decode at
// depth 8192 on 2 Zen 5 threads: 10-15% faster than one L1 prefetch 4 tiles ahead).
inline constexpr int kPrefetchTiles = 1;
inline constexpr int kPrefetchFarTiles = 8;
inline constexpr float kNegInf = -__builtin_inff();

// Rows of a row block live in registers only when their loops are fully unrolled;
// -O2 does not do that on its own. Sanitized builds (tests only) leave the loops rolled: the
// same results, and with their row blocks of 8 or 1 (AttentionKernel::row_block) a fraction
// of the kernels' compile time under clang's ASan.
#ifdef KVLM_SANITIZED_BUILD
#define KVLM_ATTENTION_UNROLL
#else
#define KVLM_ATTENTION_UNROLL _Pragma("GCC unroll 8")
#endif

// Prefetches the cache line holding p into L1 (or L2: kToL2). An asm statement because GCC's
// dead-code elimination drops __builtin_prefetch from these inlined loops.
template <bool kToL2 = false>
inline void prefetch_line(const void* p) {
#if defined(__x86_64__) || defined(__i386__)
  if constexpr (kToL2) {
    asm volatile("prefetcht1 %0" : : "m"(*static_cast<const char*>(p)));
  } else {
    asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
  }
#else
  __builtin_prefetch(p);
#endif
}

inline int min_int(int a, int b) { return a < b ? a : b; }
inline int max_int(int a, int b) { return a > b ? a : b; }

// Where one block's bytes are: the encoded block, and for KIVI the f32 staging
// rows while the block is staged (then `data` is not read).
struct BlockRef {
  const std::byte* data = nullptr;
  const float* staged = nullptr;  // [block_size, num_kv_heads, head_dim] or nullptr
};

template <bool kToL2 = false>
inline void prefetch_bytes(const void* begin, const void* end) {
  const char* b = static_cast<const char*>(begin);
  const char* e = static_cast<const char*>(end);
  if (e <= b) return;
  for (const char* p = b; p < e; p += 64) prefetch_line<kToL2>(p);
  prefetch_line<kToL2>(e - 1);  // a run that starts mid-line ends in one more line
}

inline float load_half(const uint8_t* p, float (*half)(uint16_t)) {
  uint16_t h;
  __builtin_memcpy(&h, p, sizeof h);
  return half(h);
}

// Loaders: Row, row(block, layout, kv_head, slot), rows(block, layout, kv_head, slot_begin,
// slot_end, out) (the rows of a run of slots), prefetch_slots(block, layout,
// kv_head, slot_begin, slot_end) and load(row, d) -> V::Reg holding elements
// [d, d + kWidth) of the row as f32. One per codec layout (kv/kv_block_format.h),
// generic over the ISA's ops V, which provide the element conversions:
//   load_f32/load_f16/load_bf16(const T* p)   kWidth elements at p,
//   load_i8/load_fp8/load_u4/load_u2(const uint8_t* codes, int d)   codes [d, d + kWidth)
//     of a packed row as f32 (fp8 as value / 256: see fp8_e4m3_to_fp32),
//   half(uint16_t) -> float, one f16.

// Plain codecs: a block is [num_kv_heads, block_size, head_dim] elements.
template <class V, KvType T>
struct PlainLoader {
  using Elem = std::conditional_t<T == KvType::kF32, float, uint16_t>;
  using Row = const Elem*;
  static Row row(const BlockRef& b, const KvLayout& layout, int kv_head, int slot) {
    // Same formula as plain_row_index() in kv_codec.h, written out so that no
    // external inline function is compiled with this file's ISA flags.
    const size_t row = static_cast<size_t>(kv_head) * static_cast<size_t>(layout.block_size) + static_cast<size_t>(slot);
    return reinterpret_cast<const Elem*>(b.data) + row * static_cast<size_t>(layout.head_dim);
  }
  // rows(..., s0, s1, out): out[i] = row(..., s0 + i), computed by stepping a pointer.
  static void rows(const BlockRef& b, const KvLayout& layout, int kv_head, int s0, int s1, Row* out) {
    Row r = row(b, layout, kv_head, s0);
    for (int i = 0; i < s1 - s0; ++i, r += layout.head_dim) out[i] = r;
  }
  template <bool kToL2 = false>
  static void prefetch_slots(const BlockRef& b, const KvLayout& layout, int kv_head, int slot_begin, int slot_end) {
    prefetch_bytes<kToL2>(row(b, layout, kv_head, slot_begin), row(b, layout, kv_head, slot_end));
  }
  static typename V::Reg load(Row r, int d) {
    if constexpr (T == KvType::kF32) {
      return V::load_f32(r + d);
    } else if constexpr (T == KvType::kF16) {
      return V::load_f16(r + d);
    } else {
      return V::load_bf16(r + d);
    }
  }
};

// A kv head's region inside a block and where its codes and metadata start.
template <KvType T, KvRole R>
struct Region {
  static const uint8_t* base(const BlockRef& b, const KvLayout& l, int kv_head) {
    return reinterpret_cast<const uint8_t*>(b.data) +
           static_cast<size_t>(kv_head) * kv_format::head_bytes(T, R, l.head_dim, l.block_size);
  }
  static size_t row_bytes(const KvLayout& l) { return kv_format::row_code_bytes(l.head_dim, kv_format::bits(T)); }
  static size_t meta_offset(const KvLayout& l) { return kv_format::head_code_bytes(T, l.head_dim, l.block_size); }
};

// int8 and fp8: 1-byte codes, one f16 scale per token.
template <class V, KvType T>
struct ScaledLoader {
  using Rg = Region<T, KvRole::kKey>;
  struct Row {
    const uint8_t* codes;
    float scale;
  };
  static Row row(const BlockRef& b, const KvLayout& l, int kv_head, int slot) {
    const uint8_t* base = Rg::base(b, l, kv_head);
    float s = load_half(base + Rg::meta_offset(l) + 2 * static_cast<size_t>(slot), &V::half);
    if constexpr (T == KvType::kFp8) s *= 256.0f;
    return {base + static_cast<size_t>(slot) * static_cast<size_t>(l.head_dim), s};
  }
  static void rows(const BlockRef& b, const KvLayout& l, int kv_head, int s0, int s1, Row* out) {
    const uint8_t* base = Rg::base(b, l, kv_head);
    const uint8_t* codes = base + static_cast<size_t>(s0) * static_cast<size_t>(l.head_dim);
    const uint8_t* scales = base + Rg::meta_offset(l) + 2 * static_cast<size_t>(s0);
    for (int i = 0; i < s1 - s0; ++i, codes += l.head_dim, scales += 2) {
      float sc = load_half(scales, &V::half);
      if constexpr (T == KvType::kFp8) sc *= 256.0f;
      out[i] = {codes, sc};
    }
  }
  template <bool kToL2 = false>
  static void prefetch_slots(const BlockRef& b, const KvLayout& l, int kv_head, int s0, int s1) {
    const uint8_t* base = Rg::base(b, l, kv_head);
    const size_t D = static_cast<size_t>(l.head_dim);
    prefetch_bytes<kToL2>(base + s0 * D, base + s1 * D);
    prefetch_bytes<kToL2>(base + Rg::meta_offset(l) + 2 * s0, base + Rg::meta_offset(l) + 2 * s1);
  }
  static typename V::Reg load(const Row& r, int d) {
    if constexpr (T == KvType::kInt8) {
      return V::mul(V::load_i8(r.codes, d), V::set1(r.scale));
    } else {
      return V::mul(V::load_fp8(r.codes, d), V::set1(r.scale));
    }
  }
};

// Packed unsigned codes of `bits` bits as f32.
template <class V, int kBits>
typename V::Reg load_unsigned(const uint8_t* codes, int d) {
  if constexpr (kBits == 4) {
    return V::load_u4(codes, d);
  } else {
    static_assert(kBits == 2);
    return V::load_u2(codes, d);
  }
}

// count f16 values at src as f32 into out: whole registers, then one at a time.
template <class V>
void convert_halves(const uint16_t* src, int count, float* out) {
  int i = 0;
  for (; i + V::kWidth <= count; i += V::kWidth) V::store(out + i, V::load_f16(src + i));
  for (; i < count; ++i) out[i] = V::half(src[i]);
}

// A staged (KIVI) block's f32 row of (slot, kv_head), and the distance between consecutive
// slots' rows: staging is [block_size, num_kv_heads, head_dim].
inline const float* staged_row(const BlockRef& b, const KvLayout& l, int kv_head, int slot) {
  return b.staged + (static_cast<size_t>(slot) * l.num_kv_heads + kv_head) * static_cast<size_t>(l.head_dim);
}
inline size_t staged_slot_stride(const KvLayout& l) {
  return static_cast<size_t>(l.num_kv_heads) * static_cast<size_t>(l.head_dim);
}

// N consecutive chunks of packed unsigned codes as f32, 4-bit ones unpacked several chunks at
// a time where the ISA can (V::load_u4_n); and N chunks of f32 (staged rows).
template <class V, int kBits, int N>
void load_unsigned_n(const uint8_t* codes, int d, typename V::Reg* out) {
  if constexpr (kBits == 4) {
    V::template load_u4_n<N>(codes, d, out);
  } else {
    for (int j = 0; j < N; ++j) out[j] = load_unsigned<V, kBits>(codes, d + j * V::kWidth);
  }
}
template <class V, int N>
void load_f32_n(const float* p, typename V::Reg* out) {
  for (int j = 0; j < N; ++j) out[j] = V::load_f32(p + j * V::kWidth);
}

// int4 and KIVI values: packed codes, f16 (scale, min) per group of each token's row.
// KIVI blocks may still be staged (kStaged); int4 blocks never are. As values, a run's
// (scale, min) pairs are converted to f32 once per tile (convert_meta); as int4 keys, the
// integer q·k reads the f16 pairs itself.
template <class V, KvType T, bool kStaged>
struct GroupLoader {
  using Rg = Region<T, KvRole::kValue>;
  static constexpr int kBits = kv_format::bits(T);
  struct Row {
    const uint8_t* codes;
    const uint8_t* meta;        // [head_dim / group, 2] f16
    const float* meta_f32;      // the same as f32 once convert_meta ran (values only), else nullptr
    const float* staged;        // the f32 row while staged, else nullptr
    int group_shift;            // log2 of the group size
  };
  static Row row(const BlockRef& b, const KvLayout& l, int kv_head, int slot) {
    const size_t D = static_cast<size_t>(l.head_dim);
    if (kStaged && b.staged != nullptr) return {nullptr, nullptr, nullptr, staged_row(b, l, kv_head, slot), 0};
    const int g = kv_format::group_size(l.head_dim);
    const uint8_t* base = Rg::base(b, l, kv_head);
    return {base + static_cast<size_t>(slot) * Rg::row_bytes(l),
            base + Rg::meta_offset(l) + static_cast<size_t>(slot) * (D / g) * 4, nullptr, nullptr,
            __builtin_ctz(static_cast<unsigned>(g))};
  }
  static void rows(const BlockRef& b, const KvLayout& l, int kv_head, int s0, int s1, Row* out) {
    if (kStaged && b.staged != nullptr) {
      const float* r = staged_row(b, l, kv_head, s0);
      for (int i = 0; i < s1 - s0; ++i, r += staged_slot_stride(l)) out[i] = {nullptr, nullptr, nullptr, r, 0};
      return;
    }
    Row r = row(b, l, kv_head, s0);
    const size_t rb = Rg::row_bytes(l);
    const size_t mb = static_cast<size_t>(l.head_dim / kv_format::group_size(l.head_dim)) * 4;
    for (int i = 0; i < s1 - s0; ++i, r.codes += rb, r.meta += mb) out[i] = r;
  }
  // The (scale, min) pairs of slots [s0, s1) of a block, contiguous there, converted to f32
  // in one vector pass into out ([s1 - s0, head_dim / group, 2]) and pointed to by rows
  // [0, s1 - s0): each value chunk then broadcasts its pair from memory instead of converting
  // two f16 scalars.
  static void convert_meta(const BlockRef& b, const KvLayout& l, int kv_head, int s0, int s1, float* out, Row* rows) {
    if (kStaged && b.staged != nullptr) return;
    const int pair_floats = 2 * (l.head_dim / kv_format::group_size(l.head_dim));
    convert_halves<V>(reinterpret_cast<const uint16_t*>(rows[0].meta), (s1 - s0) * pair_floats, out);
    for (int k = 0; k < s1 - s0; ++k) rows[k].meta_f32 = out + k * pair_floats;
  }
  template <bool kToL2 = false>
  static void prefetch_slots(const BlockRef& b, const KvLayout& l, int kv_head, int s0, int s1) {
    if (kStaged && b.staged != nullptr) return;  // staged blocks are the most recent, already cached
    const uint8_t* base = Rg::base(b, l, kv_head);
    const size_t rb = Rg::row_bytes(l);
    const size_t mb = static_cast<size_t>(l.head_dim / kv_format::group_size(l.head_dim)) * 4;
    prefetch_bytes<kToL2>(base + s0 * rb, base + s1 * rb);
    prefetch_bytes<kToL2>(base + Rg::meta_offset(l) + s0 * mb, base + Rg::meta_offset(l) + s1 * mb);
  }
  static typename V::Reg load(const Row& r, int d) {
    if (kStaged && r.staged != nullptr) return V::load_f32(r.staged + d);
    const float* m = r.meta_f32 + static_cast<size_t>(d >> r.group_shift) * 2;
    return V::fma(load_unsigned<V, kBits>(r.codes, d), V::set1(m[0]), V::set1(m[1]));
  }
  // out[j] = load(r, d + j * kWidth) for j < N, the same values: 4-bit codes are unpacked N
  // chunks at a time where the ISA can (V::load_u4_n).
  template <int N>
  static void load_n(const Row& r, int d, typename V::Reg* out) {
    constexpr int W = V::kWidth;
    if (kStaged && r.staged != nullptr) return load_f32_n<V, N>(r.staged + d, out);
    load_unsigned_n<V, kBits, N>(r.codes, d, out);
#pragma GCC unroll 8
    for (int j = 0; j < N; ++j) {
      const float* m = r.meta_f32 + static_cast<size_t>((d + j * W) >> r.group_shift) * 2;
      out[j] = V::fma(out[j], V::set1(m[0]), V::set1(m[1]));
    }
  }
};

// KIVI keys: packed codes, f16 scale and min per channel over the block's tokens.
template <class V, KvType T>
struct ChannelLoader {
  using Rg = Region<T, KvRole::kKey>;
  static constexpr int kBits = kv_format::bits(T);
  struct Row {
    const uint8_t* codes;
    const float* scales;  // [head_dim] f32 scales, then [head_dim] f32 mins (convert_meta)
    const float* staged;
    int head_dim;
  };
  static Row row(const BlockRef& b, const KvLayout& l, int kv_head, int slot) {
    if (b.staged != nullptr) return {nullptr, nullptr, staged_row(b, l, kv_head, slot), l.head_dim};
    const uint8_t* base = Rg::base(b, l, kv_head);
    return {base + static_cast<size_t>(slot) * Rg::row_bytes(l), nullptr, nullptr, l.head_dim};
  }
  static void rows(const BlockRef& b, const KvLayout& l, int kv_head, int s0, int s1, Row* out) {
    if (b.staged != nullptr) {
      const float* r = staged_row(b, l, kv_head, s0);
      for (int i = 0; i < s1 - s0; ++i, r += staged_slot_stride(l)) out[i] = {nullptr, nullptr, r, l.head_dim};
      return;
    }
    Row r = row(b, l, kv_head, s0);
    const size_t rb = Rg::row_bytes(l);
    for (int i = 0; i < s1 - s0; ++i, r.codes += rb) out[i] = r;
  }
  // The block's channel scales and mins (f16, shared by all its tokens) converted to f32 once
  // per run of slots into out ([2, head_dim]), which rows [0, s1 - s0) then point to: a key
  // chunk reads them as plain f32 instead of converting 2 × head_dim halves per token.
  static void convert_meta(const BlockRef& b, const KvLayout& l, int kv_head, int s0, int s1, float* out, Row* rows) {
    if (b.staged != nullptr) return;
    convert_halves<V>(reinterpret_cast<const uint16_t*>(Rg::base(b, l, kv_head) + Rg::meta_offset(l)), 2 * l.head_dim,
                      out);
    for (int k = 0; k < s1 - s0; ++k) rows[k].scales = out;
  }
  template <bool kToL2 = false>
  static void prefetch_slots(const BlockRef& b, const KvLayout& l, int kv_head, int s0, int s1) {
    if (b.staged != nullptr) return;
    const uint8_t* base = Rg::base(b, l, kv_head);
    const size_t rb = Rg::row_bytes(l);
    prefetch_bytes<kToL2>(base + s0 * rb, base + s1 * rb);
    if (s0 == 0) prefetch_bytes<kToL2>(base + Rg::meta_offset(l), base + Rg::meta_offset(l) + 4 * l.head_dim);
  }
  static typename V::Reg load(const Row& r, int d) {
    if (r.staged != nullptr) return V::load_f32(r.staged + d);
    return V::fma(load_unsigned<V, kBits>(r.codes, d), V::load_f32(r.scales + d), V::load_f32(r.scales + r.head_dim + d));
  }
  // out[j] = load(r, d + j * kWidth) for j < N; 4-bit codes unpacked N chunks at a time.
  template <int N>
  static void load_n(const Row& r, int d, typename V::Reg* out) {
    constexpr int W = V::kWidth;
    if (r.staged != nullptr) return load_f32_n<V, N>(r.staged + d, out);
    load_unsigned_n<V, kBits, N>(r.codes, d, out);
#pragma GCC unroll 8
    for (int j = 0; j < N; ++j) {
      out[j] = V::fma(out[j], V::load_f32(r.scales + d + j * W), V::load_f32(r.scales + r.head_dim + d + j * W));
    }
  }
};

// Integer q·k over int8 and int4 keys (query_rounding.h): the scalar forms, which the
// portable kernels use and the SIMD ones fall back to for shapes their registers do not fit.
// Both produce the sums in units of the row's step; AttentionKernel::int_qk turns them into scores.

// s[r, t] = sum_d q[r, d] c_t[d] over each token's int8 codes (exact integers, as f32).
template <int NR, class Row>
void qk_int8_scalar(const int16_t* q /*[NR, qp]*/, size_t qp, const Row* rows, int n, int D,
                    float* s /*[NR, kTileTokens]*/) {
  for (int t = 0; t < n; ++t) {
    const int8_t* c = reinterpret_cast<const int8_t*>(rows[t].codes);
    for (int r = 0; r < NR; ++r) {
      const int16_t* qr = q + static_cast<size_t>(r) * qp;
      int32_t acc = 0;
      for (int d = 0; d < D; ++d) acc += static_cast<int32_t>(qr[d]) * static_cast<int32_t>(c[d]);
      s[r * kTileTokens + t] = static_cast<float>(acc);
    }
  }
}

// s[r, t] = sum_g (scale_{t,g} sum_{d in g} q[r, d] c_t[d] + min_{t,g} qsum[r, g]) over each
// token's packed 4-bit codes with f16 (scale, min) pairs per group of g values: q̂ · k in units
// of the row's step. q in natural order; qsum_pairs[r] = [0, qsum_0, 0, qsum_1, ...].
template <class V, int NR, class Row>
void qk_int4_scalar(const int16_t* q /*[NR, qp]*/, size_t qp, const float* qsum_pairs /*[NR, pp]*/, size_t pp,
                    const Row* rows, int n, int D, int g, float* s /*[NR, kTileTokens]*/) {
  for (int t = 0; t < n; ++t) {
    const uint8_t* c = rows[t].codes;
    const uint8_t* meta = rows[t].meta;
    for (int r = 0; r < NR; ++r) {
      const int16_t* qr = q + static_cast<size_t>(r) * qp;
      float sum = 0.0f;
      for (int g0 = 0; g0 < D; g0 += g) {
        int32_t acc = 0;
        for (int d = g0; d < g0 + g; ++d) {
          acc += static_cast<int32_t>(qr[d]) * static_cast<int32_t>((c[d >> 1] >> ((d & 1) * 4)) & 0xf);
        }
        const size_t gi = static_cast<size_t>(g0 / g);
        sum += load_half(meta + gi * 4, &V::half) * static_cast<float>(acc);
        sum += load_half(meta + gi * 4 + 2, &V::half) * qsum_pairs[static_cast<size_t>(r) * pp + 2 * gi + 1];
      }
      s[r * kTileTokens + t] = sum;
    }
  }
}

// Packed 4-bit codes split into low and high nibbles: a SIMD chunk of C values is the C/2
// even-indexed values, then the C/2 odd-indexed ones. Queries are laid out to match, zero
// past head_dim. C == 0 keeps the natural order.
inline void arrange_int4_query(const int16_t* natural, int D, int C, size_t qp, int16_t* out) {
  for (size_t i = 0; i < qp; ++i) out[i] = 0;
  if (C == 0) {
    for (int d = 0; d < D; ++d) out[d] = natural[d];
    return;
  }
  for (int d = 0; d < D; ++d) {
    const int chunk = d / C;
    const int i = d % C;
    out[chunk * C + (i % 2) * (C / 2) + i / 2] = natural[d];
  }
}

}  // namespace
}  // namespace kvlm::attention_internal
