#include "core/thread_pool.h"

#include <algorithm>
#include <vector>

#include "core/check.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVLM_CPU_RELAX() _mm_pause()
#else
#define KVLM_CPU_RELAX() std::this_thread::yield()
#endif

namespace kvlm {

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

int ThreadPool::default_num_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

void ThreadPool::drain_tasks() {
  for (;;) {
    const int64_t task = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (task >= num_tasks_) return;
    // After a task threw, the rest are only counted: run() rethrows on the caller's thread.
    if (!failed_.load(std::memory_order_relaxed)) {
      try {
        (*job_)(task);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex_);
        if (!error_) error_ = std::current_exception();
        failed_.store(true, std::memory_order_relaxed);
      }
    }
    tasks_done_.fetch_add(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    // Spin briefly: decode issues many small jobs back to back, and a sleeping
    // worker takes tens of microseconds to wake.
    bool woke = false;
    for (int spin = 0; spin < 20000; ++spin) {
      if (generation_.load(std::memory_order_acquire) != seen) {
        woke = true;
        break;
      }
      KVLM_CPU_RELAX();
    }
    std::unique_lock<std::mutex> lock(mutex_);
    if (!woke) wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
    seen = generation_.load(std::memory_order_acquire);
    if (stopping_) return;
    // Join the job only while run() still owns it; run() waits for every joined
    // worker before it returns, so job_ and num_tasks_ stay valid while we drain.
    if (job_ == nullptr) continue;
    ++active_workers_;
    lock.unlock();
    drain_tasks();
    lock.lock();
    --active_workers_;
  }
}

void ThreadPool::run(int64_t num_tasks, const std::function<void(int64_t)>& fn) {
  if (num_tasks <= 0) return;
  if (workers_.empty() || num_tasks == 1) {
    for (int64_t i = 0; i < num_tasks; ++i) fn(i);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    KVLM_CHECK(job_ == nullptr, "ThreadPool::run is not reentrant");
    job_ = &fn;
    num_tasks_ = num_tasks;
    next_task_.store(0, std::memory_order_relaxed);
    tasks_done_.store(0, std::memory_order_relaxed);
    failed_.store(false, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  drain_tasks();
  for (;;) {
    if (tasks_done_.load(std::memory_order_acquire) >= num_tasks) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (active_workers_ == 0) {
        job_ = nullptr;
        break;
      }
    }
    KVLM_CPU_RELAX();
  }
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(error_mutex_);
    std::swap(error, error_);
  }
  if (error) std::rethrow_exception(error);
}

void ThreadPool::parallel_for(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(1, min_chunk);
  // A few chunks per thread balance uneven work without much overhead.
  const int64_t max_chunks = static_cast<int64_t>(num_threads_) * 4;
  const int64_t num_chunks = std::clamp<int64_t>(n / min_chunk, 1, max_chunks);
  const int64_t chunk = (n + num_chunks - 1) / num_chunks;
  const int64_t actual_chunks = (n + chunk - 1) / chunk;
  run(actual_chunks, [&](int64_t c) {
    const int64_t begin = c * chunk;
    fn(begin, std::min(n, begin + chunk));
  });
}

void ThreadPool::parallel_for_tapered(int64_t n, int64_t min_chunk,
                                      const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(1, min_chunk);
  // Equal chunks (parallel_for's four per thread) leave one thread idle for half a chunk on
  // average at the end: 6% of a 512-token prefill on 2 threads.
  std::vector<int64_t> bounds{0};
  const int64_t share = 2 * static_cast<int64_t>(num_threads_);
  while (bounds.back() < n) {
    const int64_t left = n - bounds.back();
    bounds.push_back(bounds.back() + std::min(left, std::max(min_chunk, (left + share - 1) / share)));
  }
  run(static_cast<int64_t>(bounds.size()) - 1, [&](int64_t c) { fn(bounds[c], bounds[c + 1]); });
}

}  // namespace kvlm
