#include "core/heap_trimmer.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace kvlm {

HeapTrimmer::HeapTrimmer(std::chrono::milliseconds interval) : interval_(interval), thread_([this] { run(); }) {}

HeapTrimmer::~HeapTrimmer() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

int HeapTrimmer::num_trims() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return num_trims_;
}

bool HeapTrimmer::trim_now() {
#if defined(__GLIBC__)
  return malloc_trim(0) != 0;
#else
  return false;
#endif
}

void HeapTrimmer::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, interval_, [this] { return stopping_; })) {
    // Not under the lock: trimming walks every arena, taking each one's own lock in turn.
    lock.unlock();
    trim_now();
    lock.lock();
    ++num_trims_;
  }
}

}  // namespace kvlm
