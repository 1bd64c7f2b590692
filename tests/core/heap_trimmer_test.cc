// HeapTrimmer: it trims on its interval, stops at once, and a trim really releases freed pages.
#include "core/heap_trimmer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

// gcc says __SANITIZE_*__, clang __has_feature.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KVLM_UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define KVLM_UNDER_SANITIZER 1
#endif
#endif

namespace kvlm {
namespace {

TEST(HeapTrimmer, TrimsOnItsIntervalAndStopsAtOnce) {
  const auto t0 = std::chrono::steady_clock::now();
  {
    HeapTrimmer trimmer(std::chrono::milliseconds(20));
    while (trimmer.num_trims() < 3 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_GE(trimmer.num_trims(), 3);
  }
  {
    HeapTrimmer idle(std::chrono::hours(1));
    EXPECT_EQ(idle.num_trims(), 0);
  }  // the destructor wakes it: no hour-long wait
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
}

TEST(HeapTrimmer, ATrimReleasesPagesFreedInTheMiddleOfAnArena) {
#if defined(KVLM_UNDER_SANITIZER)
  GTEST_SKIP() << "a sanitizer's allocator replaces glibc's arenas; malloc_trim has nothing to trim";
#elif !defined(__GLIBC__)
  GTEST_SKIP() << "malloc_trim is glibc's; this C library has no trim";
#else
  // 32 MiB in 16 KiB pieces (under the mmap threshold: they come from an arena), all freed but
  // the last, which pins the arena's top so only a trim can give the rest back.
  std::vector<void*> pieces;
  for (int i = 0; i < 2048; ++i) pieces.push_back(std::malloc(16 << 10));
  for (size_t i = 0; i + 1 < pieces.size(); ++i) std::free(pieces[i]);
  EXPECT_TRUE(HeapTrimmer::trim_now());
  std::free(pieces.back());
#endif
}

}  // namespace
}  // namespace kvlm
