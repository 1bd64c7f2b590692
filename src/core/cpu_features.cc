#include "core/cpu_features.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace kvlm {
namespace {

// A function-local static: cpu_features() may run during other files' static initialization.
std::string& amx_reason_storage() {
  static std::string reason;
  return reason;
}

// Linux hands out the AMX tile data state (XFEATURE_XTILEDATA, 8 KB per thread) only on request,
// once per process; threads created later share the permission. Returns "" or why it failed.
std::string request_amx_permission() {
#if defined(__linux__) && defined(__x86_64__)
  constexpr long kArchGetXcompPerm = 0x1022;
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr int kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
    return std::string("the kernel refused the AMX tile permission (arch_prctl ARCH_REQ_XCOMP_PERM: ") +
           std::strerror(errno) + ")";
  }
  unsigned long granted = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &granted) != 0 || (granted & (1ul << kXfeatureXtiledata)) == 0) {
    return "the kernel did not report the AMX tile permission as granted";
  }
  return "";
#else
  return "AMX needs Linux on x86-64 here";
#endif
}

#if defined(__x86_64__) || defined(__i386__)
uint64_t read_xcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return f;
  const bool osxsave = ecx & (1u << 27);
  if (!osxsave) return f;
  const uint64_t xcr0 = read_xcr0();
  const bool os_avx = (xcr0 & 0x6) == 0x6;
  const bool os_avx512 = (xcr0 & 0xe6) == 0xe6;
  const bool os_amx = (xcr0 & (3u << 17)) == (3u << 17);
  f.fma = os_avx && (ecx & (1u << 12));
  f.f16c = os_avx && (ecx & (1u << 29));
  unsigned max_leaf = __get_cpuid_max(0, nullptr);
  if (max_leaf < 7) return f;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  f.avx2 = os_avx && (ebx & (1u << 5));
  f.avx512f = os_avx512 && (ebx & (1u << 16));
  f.avx512bw = os_avx512 && (ebx & (1u << 30));
  f.avx512vl = os_avx512 && (ebx & (1u << 31));
  f.avx512dq = os_avx512 && (ebx & (1u << 17));
  f.avx512vnni = os_avx512 && (ecx & (1u << 11));
  f.amx_bf16 = os_amx && (edx & (1u << 22));
  f.amx_tile = os_amx && (edx & (1u << 24));
  f.amx_int8 = os_amx && (edx & (1u << 25));
  unsigned eax1, ebx1, ecx1, edx1;
  __cpuid_count(7, 1, eax1, ebx1, ecx1, edx1);
  f.avx_vnni = os_avx && (eax1 & (1u << 4));
  f.avx512bf16 = os_avx512 && (eax1 & (1u << 5));
  return f;
}
#else
CpuFeatures detect() { return CpuFeatures{}; }
#endif

}  // namespace

std::string CpuFeatures::summary() const {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(f16c, "f16c");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512dq, "avx512dq");
  add(avx512vnni, "avx512vnni");
  add(avx512bf16, "avx512bf16");
  add(avx_vnni, "avx_vnni");
  add(amx_tile, "amx_tile");
  add(amx_int8, "amx_int8");
  add(amx_bf16, "amx_bf16");
  return s.empty() ? "portable" : s;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = [] {
    const char* forced = std::getenv("KVLM_CPU");
    const std::string level = forced != nullptr ? forced : "";
    if (!level.empty() && level != "portable" && level != "avx2" && level != "avx512") {
      std::fprintf(stderr, "kvlm: warning: KVLM_CPU=%s is not one of portable, avx2, avx512; ignored\n", forced);
    }
    if (level == "portable") return CpuFeatures{};
    CpuFeatures f = detect();
    if (level == "avx2") {  // everything past AVX2 off
      f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = f.avx512vnni = f.avx512bf16 = false;
      f.avx_vnni = false;
    }
    std::string& amx_reason = amx_reason_storage();
    if (f.amx_tile) {
      if (level == "avx2" || level == "avx512") {
        amx_reason = "KVLM_CPU=" + level + " turns AMX off";
      } else {
        amx_reason = request_amx_permission();
        if (!amx_reason.empty()) {
          std::fprintf(stderr, "kvlm: warning: this CPU has AMX but %s; AMX kernels are off\n",
                       amx_reason.c_str());
        }
      }
      if (!amx_reason.empty()) f.amx_tile = f.amx_int8 = f.amx_bf16 = false;
    }
    return f;
  }();
  return features;
}

const std::string& amx_unavailable_reason() {
  cpu_features();
  return amx_reason_storage();
}

}  // namespace kvlm
