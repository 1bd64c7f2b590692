// FaultInjection: a test seam that makes a chosen allocation fail, so the reactions to running out
// of memory are tested deterministically instead of hoped for.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace kvlm {

// Production code holds a null pointer (EngineOptions::faults) and pays one branch per seam.
// A test owns the object, arms a site, and reads back how many faults fired, so nothing leaks
// from one test to the next. Arming and the seams may run on different threads.
class FaultInjection {
 public:
  enum class Site : uint8_t {
    kBlockAllocation,  // BlockPool::allocate answers nullopt, as if the pool were empty
    kStepForward,      // the engine's batched forward throws std::bad_alloc before it runs
  };
  static constexpr size_t kNumSites = 2;

  // The call at `site` after `num_passing` more calls there fails, once (0: the next one).
  void fail_after(Site site, int64_t num_passing) { countdown(site).store(num_passing); }
  // Asked at the seam: true when this call must fail. Disarms itself after firing.
  bool should_fail(Site site) {
    std::atomic<int64_t>& left = countdown(site);
    int64_t now = left.load();
    while (now >= 0) {
      if (left.compare_exchange_weak(now, now - 1)) {
        if (now > 0) return false;
        fired_[index(site)].fetch_add(1);
        return true;
      }
    }
    return false;
  }
  // Faults that fired at `site` so far: a test asserts its fault really happened.
  int64_t num_fired(Site site) const { return fired_[index(site)].load(); }

 private:
  static size_t index(Site site) { return static_cast<size_t>(site); }
  std::atomic<int64_t>& countdown(Site site) { return countdown_[index(site)]; }

  std::array<std::atomic<int64_t>, kNumSites> countdown_{-1, -1};  // -1: disarmed
  std::array<std::atomic<int64_t>, kNumSites> fired_{0, 0};
};

}  // namespace kvlm
