// Portable attention kernels: one lane per "register", any head_dim, any CPU.
#include <cmath>

#include "attention/attention_kernel.h"
#include "attention/attention_kernel_impl.h"
#include "core/dtype.h"

namespace kvlm::attention_internal {
namespace {

struct ScalarOps {
  using Reg = float;
  static constexpr int kWidth = 1;
  static Reg zero() { return 0.0f; }
  static Reg load(const float* p) { return *p; }
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
};

struct F32Scalar : PlainRows<float> {
  static float load(Row row, int d) { return row[d]; }
};

struct F16Scalar : PlainRows<uint16_t> {
  static float load(Row row, int d) { return fp16_to_fp32(row[d]); }
};

}  // namespace

AttentionKernelFn attention_kernel_portable(KvType k_type, KvType v_type) {
  return select_kernel<ScalarOps, F32Scalar, F16Scalar>(k_type, v_type);
}

}  // namespace kvlm::attention_internal
