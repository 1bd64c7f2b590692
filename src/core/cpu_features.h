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
  // AMX counts as present only once Linux has granted this process the tile data state
  // (arch_prctl ARCH_REQ_XCOMP_PERM): without it the first tile instruction is SIGILL.
  bool amx_tile = false;
  bool amx_int8 = false;
  bool amx_bf16 = false;

  std::string summary() const;  // e.g. "avx2 fma f16c avx512f ..."
};

// Detected once; KVLM_CPU in the environment lowers it, so tests and benchmarks can exercise
// the lower paths on any machine: portable turns every feature off, avx2 every feature past
// AVX2/FMA/F16C, avx512 only AMX. Any other value is a warning on stderr (and ignored).
const CpuFeatures& cpu_features();

// Why AMX is off although the CPU has it (empty when it is on, or the CPU lacks it): the
// kernel refused the tile permission, or KVLM_CPU turned it off.
const std::string& amx_unavailable_reason();

}  // namespace kvlm
