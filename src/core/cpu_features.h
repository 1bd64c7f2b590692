// What the running CPU can do; kernels dispatch on this, never on compile flags alone.
#pragma once

#include <string>

namespace kvlm {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512vnni = false;
  bool avx512bf16 = false;
  bool avx_vnni = false;
  bool amx_tile = false;
  bool amx_int8 = false;
  bool amx_bf16 = false;

  std::string summary() const;  // e.g. "avx2 fma f16c avx512f ..."
};

// Detected once; KVLM_CPU=portable in the environment turns every feature off, KVLM_CPU=avx2
// every feature past AVX2/FMA/F16C, so tests and benchmarks can exercise the lower paths on
// any machine.
const CpuFeatures& cpu_features();

}  // namespace kvlm
