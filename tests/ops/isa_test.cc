// Which ISA levels this CPU offers, checked against CPUID read here (not through
// cpu_features), and the AMX tile permission the process must hold before using tiles.
#include "ops/isa.h"

#include <cpuid.h>
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "core/cpu_features.h"

namespace kvlm {
namespace {

using ops_internal::Isa;

// What Isa::kAmx needs (its kernel multiplies bf16 tiles, converts activations with
// AVX512-BF16 and runs the AVX-512 kernels for the rest): AVX512F/BW/VL (leaf 7 EBX bits 16,
// 30, 31), VNNI (ECX bit 11), AMX-TILE and AMX-BF16 (EDX bits 24, 22) and AVX512-BF16 (leaf 7
// subleaf 1 EAX bit 5).
bool cpuid_reports_amx_bf16() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  const bool avx512 = (ebx & (1u << 16)) != 0 && (ebx & (1u << 30)) != 0 && (ebx & (1u << 31)) != 0 &&
                      (ecx & (1u << 11)) != 0;
  const bool tiles = avx512 && (edx & (1u << 24)) != 0 && (edx & (1u << 22)) != 0;
  __cpuid_count(7, 1, eax, ebx, ecx, edx);
  return tiles && (eax & (1u << 5)) != 0;  // AVX512-BF16
}

bool cpu_level_forced() { return std::getenv("KVLM_CPU") != nullptr; }

TEST(Isa, AmxIsOfferedExactlyWhenTheCpuHasItAndTheKernelGrantedTiles) {
  if (cpu_level_forced()) GTEST_SKIP() << "KVLM_CPU is set: the levels are lowered on purpose";
  if (!cpuid_reports_amx_bf16()) {
    EXPECT_FALSE(ops_internal::isa_supported(Isa::kAmx));
    GTEST_SKIP() << "this CPU has no AMX-BF16 with AVX512-BF16: the AMX level is reported as absent";
  }
  ASSERT_TRUE(ops_internal::isa_supported(Isa::kAmx)) << amx_unavailable_reason();
  EXPECT_EQ(ops_internal::best_isa(), Isa::kAmx);
  EXPECT_TRUE(amx_unavailable_reason().empty());
  // The permission is the process's: ARCH_GET_XCOMP_PERM lists XTILEDATA (bit 18).
  unsigned long granted = 0;
  ASSERT_EQ(syscall(SYS_arch_prctl, 0x1022, &granted), 0);
  EXPECT_NE(granted & (1ul << 18), 0u);
}

// KVLM_CPU is read once per process: each case runs in a child started after setenv.
class IsaLevelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GTEST_FLAG_SET(death_test_style, "threadsafe");  // re-executes the binary: fresh statics
  }
  void TearDown() override { unsetenv("KVLM_CPU"); }
};

TEST_F(IsaLevelTest, Avx512LevelTurnsOnlyAmxOff) {
  if (cpu_level_forced()) GTEST_SKIP() << "KVLM_CPU is set";
  if (!cpuid_reports_amx_bf16()) GTEST_SKIP() << "this CPU has no AMX-BF16 with AVX512-BF16";
  setenv("KVLM_CPU", "avx512", 1);
  EXPECT_EXIT(
      {
        const bool ok = !ops_internal::isa_supported(Isa::kAmx) && ops_internal::isa_supported(Isa::kAvx512) &&
                        ops_internal::best_isa() == Isa::kAvx512 &&
                        amx_unavailable_reason().find("KVLM_CPU=avx512") != std::string::npos;
        std::exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST_F(IsaLevelTest, UnknownLevelIsAWarning) {
  if (cpu_level_forced()) GTEST_SKIP() << "KVLM_CPU is set";
  setenv("KVLM_CPU", "avx1024", 1);
  EXPECT_EXIT(
      {
        cpu_features();
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "KVLM_CPU=avx1024 is not one of portable, avx2, avx512");
}

TEST_F(IsaLevelTest, PortableLevelOffersOnlyPortable) {
  if (cpu_level_forced()) GTEST_SKIP() << "KVLM_CPU is set";
  setenv("KVLM_CPU", "portable", 1);
  EXPECT_EXIT(
      {
        const auto isas = ops_internal::available_isas();
        std::exit(isas.size() == 1 && isas[0] == Isa::kPortable ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace kvlm
