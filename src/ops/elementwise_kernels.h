// Internal to ops/: the per-ISA kernels behind rms_norm, silu_mul and softmax. Tests call
// each ISA's table directly so every path this CPU can run is checked.
#pragma once

#include <cstdint>

#include "ops/isa.h"

namespace kvlm::ops_internal {

// Same contracts as the public functions in ops/elementwise.h (arguments already checked).
struct ElementwiseKernels {
  void (*rms_norm)(const float* x, const float* weight, float* out, int64_t n, float eps);
  void (*silu_mul)(const float* gate, const float* up, float* out, int64_t n);
  void (*softmax)(float* x, int64_t n);
};

const ElementwiseKernels& elementwise_kernels_portable();
const ElementwiseKernels& elementwise_kernels_avx2();
const ElementwiseKernels& elementwise_kernels_avx512();
// The table for `isa`, which the CPU must support.
const ElementwiseKernels& elementwise_kernels(Isa isa);

}  // namespace kvlm::ops_internal
