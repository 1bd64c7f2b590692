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

bool cpuid_reports_amx_int8() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  return (edx & (1u << 24)) != 0 && (edx & (1u << 25)) != 0;  // AMX-TILE, AMX-INT8
}

bool cpu_level_forced() { return std::getenv("KVLM_CPU") != nullptr; }

TEST(Isa, AmxIsOfferedExactlyWhenTheCpuHasItAndTheKernelGrantedTiles) {
  if (cpu_level_forced()) GTEST_SKIP() << "KVLM_CPU is set: the levels are lowered on purpose";
  if (!cpuid_reports_amx_int8()) {
    EXPECT_FALSE(ops_internal::isa_supported(Isa::kAmx));
    GTEST_SKIP() << "this CPU has no AMX-INT8: the AMX level is reported as absent";
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
  if (!cpuid_reports_amx_int8()) GTEST_SKIP() << "this CPU has no AMX-INT8";
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
