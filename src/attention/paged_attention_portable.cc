// Portable attention kernels: one lane per "register", any head_dim, any CPU.
#include <cmath>

#include "attention/attention_kernel.h"
#include "attention/attention_kernel_impl.h"
#include "core/dtype.h"

namespace kvlm::attention_internal {
namespace {

struct ScalarOps {
  static constexpr KernelFamily kFamily = KernelFamily::kPortable;
  using Reg = float;
  static constexpr int kWidth = 1;
  static Reg zero() { return 0.0f; }
  static Reg load(const float* p) { return *p; }
  static Reg load_reg(const float* p) { return *p; }
  static void store(float* p, Reg v) { *p = v; }
  static Reg set1(float x) { return x; }
  static Reg fma(Reg a, Reg b, Reg c) { return a * b + c; }
  static Reg add(Reg a, Reg b) { return a + b; }
  static Reg mul(Reg a, Reg b) { return a * b; }
  static Reg max(Reg a, Reg b) { return a > b ? a : b; }
  static float reduce_add(Reg v) { return v; }
  static float reduce_max(Reg v) { return v; }
  static Reg exp(Reg x) { return std::exp(x); }
  // One lane: no register blocking to gain.
  template <int NR>
  static constexpr int qk_tokens() { return 1; }
  template <int NR>
  static constexpr int pv_chunks() { return 1; }
  template <int N>
  static void reduce_add_n(const Reg* v, float* out) {
    for (int i = 0; i < N; ++i) out[i] = v[i];
  }
  // Element conversions for the loaders (attention_kernel_impl.h).
  static float half(uint16_t h) { return fp16_to_fp32(h); }
  static Reg load_f32(const float* p) { return *p; }
  static Reg load_f16(const uint16_t* p) { return fp16_to_fp32(*p); }
  static Reg load_bf16(const uint16_t* p) { return bf16_to_fp32(*p); }
  static Reg load_i8(const uint8_t* codes, int d) { return static_cast<float>(static_cast<int8_t>(codes[d])); }
  static Reg load_fp8(const uint8_t* codes, int d) {
    const uint32_t c = codes[d];
    return fp16_to_fp32(static_cast<uint16_t>(((c & 0x80u) << 8) | ((c & 0x7fu) << 7)));
  }
  static Reg load_u4(const uint8_t* codes, int d) { return static_cast<float>((codes[d / 2] >> (4 * (d % 2))) & 0xfu); }
  static Reg load_u2(const uint8_t* codes, int d) { return static_cast<float>((codes[d / 4] >> (2 * (d % 4))) & 0x3u); }
  template <int N>
  static void load_u4_n(const uint8_t* codes, int d, Reg* out) {
    for (int j = 0; j < N; ++j) out[j] = load_u4(codes, d + j);
  }
  // Integer q·k: the scalar forms, with the queries in natural order.
  static constexpr int kInt4Chunk = 0;
  static constexpr int kInt4SegmentGroups = 1;  // unused: no SIMD int4 form
  static bool int4_fits(int, int) { return false; }
  template <int NR, class Row>
  static void qk_int8(const int16_t* q, size_t qp, const Row* rows, int n, int D, float* s) {
    qk_int8_scalar<NR>(q, qp, rows, n, D, s);
  }
  template <int NR, class Row>
  static void qk_int4(const int16_t* q, size_t qp, const float* qsum_pairs, size_t pp, const int32_t*, const Row* rows,
                      int n, int D, int g, float* s) {
    qk_int4_scalar<ScalarOps, NR>(q, qp, qsum_pairs, pp, rows, n, D, g, s);
  }
};

}  // namespace

AttentionKernelFn attention_kernel_portable(KvType k_type, KvType v_type) {
  return select_kernel<ScalarOps>(k_type, v_type);
}

AttentionKernelFn latent_attention_kernel_portable(KvType row_type) {
  return select_latent_kernel<ScalarOps>(row_type);
}

}  // namespace kvlm::attention_internal
