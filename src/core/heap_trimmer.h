// HeapTrimmer: hands the heap's free pages back to the OS every few seconds, for a process that
// runs for weeks (kvlm serve).
//
// Why: a server's HTTP threads each allocate and free per request (bodies, JSON, a compressor
// for each JSON reply). glibc spreads threads over up to 8 arenas per core and gives a free
// page back only when it lies at the top of its arena, so pages freed in the middle of an arena
// stay resident: RSS creeps up for hours with nothing leaked (heaptrack over the soak shows a
// flat heap while RSS grows). malloc_trim(0) releases every whole free page in every arena; the
// settings glibc reads only at start-up (per-thread caches, arenas) are apps/server_malloc.h's.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace kvlm {

class HeapTrimmer {
 public:
  // Starts the thread; the first trim is one interval from now.
  explicit HeapTrimmer(std::chrono::milliseconds interval);
  ~HeapTrimmer();  // stops and joins
  HeapTrimmer(const HeapTrimmer&) = delete;
  HeapTrimmer& operator=(const HeapTrimmer&) = delete;

  // Trims done so far (tests).
  int num_trims() const;
  // One trim now, on the caller's thread; true when glibc released memory. Without glibc it
  // does nothing and answers false.
  static bool trim_now();

 private:
  void run();

  const std::chrono::milliseconds interval_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  int num_trims_ = 0;
  std::thread thread_;
};

}  // namespace kvlm
