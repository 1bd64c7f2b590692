// Internal to ops/: the instruction sets ops kernels are built for, and which this CPU runs.
#pragma once

#include <string_view>
#include <vector>

namespace kvlm::ops_internal {

enum class Isa {
  kPortable,  // plain C++, any CPU; also what KVLM_CPU=portable selects
  kAvx2,      // AVX2 + FMA + F16C
  kAvx512,    // AVX-512 F/BW/VL/DQ + VNNI (plus everything kAvx2 needs)
  kAmx,       // kAvx512 plus AVX512-BF16 and AMX-TILE/BF16: tile kernels for batches of Q8_0 / Q4_0;
              // everything else (and every single-token matmul) runs the kAvx512 kernels
};

std::string_view isa_name(Isa isa);
bool isa_supported(Isa isa);
// The ISAs this CPU can run (per cpu_features()), portable first, best last.
std::vector<Isa> available_isas();
Isa best_isa();

}  // namespace kvlm::ops_internal
