#include "ops/isa.h"

#include "core/cpu_features.h"

namespace kvlm::ops_internal {

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::kPortable:
      return "portable";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAmx:
      return "amx";
  }
  return "?";
}

bool isa_supported(Isa isa) {
  const CpuFeatures& f = cpu_features();
  switch (isa) {
    case Isa::kPortable:
      return true;
    case Isa::kAvx2:
      return f.avx2 && f.fma && f.f16c;
    case Isa::kAvx512:
      // The avx512 files are compiled with f, bw, vl, dq and vnni: all must be present.
      return f.avx2 && f.fma && f.f16c && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512vnni;
    case Isa::kAmx:  // cpu_features() reports AMX only once the kernel granted the tile state
      return isa_supported(Isa::kAvx512) && f.avx512bf16 && f.amx_tile && f.amx_bf16;
  }
  return false;
}

std::vector<Isa> available_isas() {
  std::vector<Isa> isas;
  for (Isa isa : {Isa::kPortable, Isa::kAvx2, Isa::kAvx512, Isa::kAmx}) {
    if (isa_supported(isa)) isas.push_back(isa);
  }
  return isas;
}

Isa best_isa() {
  static const Isa best = available_isas().back();
  return best;
}

}  // namespace kvlm::ops_internal
