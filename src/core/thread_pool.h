// ThreadPool: persistent worker threads that split a range of work; the caller takes part.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvlm {

class ThreadPool {
 public:
  // num_threads counts the calling thread: 1 means no workers, everything runs inline.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Runs fn(task_idx) for task_idx in [0, num_tasks) across the threads and waits for all.
  // Tasks are handed out dynamically, so uneven tasks balance. Not reentrant. When a task throws
  // (std::bad_alloc in a kernel's scratch, say), the tasks not yet begun are skipped and run()
  // rethrows the first exception on the caller's thread once every thread is out: a worker never
  // ends the process, and the pool stays usable.
  void run(int64_t num_tasks, const std::function<void(int64_t)>& fn);

  // Splits [0, n) into contiguous chunks of at least `min_chunk` and calls fn(begin, end).
  void parallel_for(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn);

  // As parallel_for, for long uneven work: chunks shrink as the work runs out (each a
  // 1/(2·threads) share of what remains, at least `min_chunk`), so at the end no thread waits
  // long for another. The boundaries depend on (n, min_chunk, threads) alone.
  void parallel_for_tapered(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn);

  // The machine's hardware threads (at least 1).
  static int default_num_threads();

 private:
  void worker_loop();
  void drain_tasks();

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  const std::function<void(int64_t)>* job_ = nullptr;  // valid while a run() is active
  int64_t num_tasks_ = 0;
  std::atomic<int64_t> next_task_{0};
  std::atomic<int64_t> tasks_done_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> failed_{false};  // a task of the current run() threw
  std::mutex error_mutex_;
  std::exception_ptr error_;  // the first exception of the current run(); guarded by error_mutex_
  int active_workers_ = 0;  // workers inside drain_tasks(); guarded by mutex_
  bool stopping_ = false;
};

}  // namespace kvlm
