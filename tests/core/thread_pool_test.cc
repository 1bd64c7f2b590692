#include "core/thread_pool.h"

#include <atomic>
#include <chrono>
#include <new>
#include <numeric>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace kvlm {
namespace {

TEST(ThreadPool, RunsEveryTaskOnce) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    for (int round = 0; round < 200; ++round) {
      std::vector<std::atomic<int>> hits(97);
      pool.run(97, [&](int64_t i) { hits[i].fetch_add(1); });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1);
    }
  }
}

TEST(ThreadPool, ParallelForCoversRangeExactly) {
  ThreadPool pool(3);
  for (int64_t n : {1, 7, 64, 1000}) {
    std::vector<std::atomic<int>> hits(n);
    pool.parallel_for(n, 5, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
}

// A kernel that runs out of memory on a worker must not end the process: the caller gets the
// exception (the engine then ends that step's requests) and the pool keeps working.
TEST(ThreadPool, ATaskThatThrowsOnAWorkerIsRethrownToTheCaller) {
  ThreadPool pool(2);
  for (int round = 0; round < 20; ++round) {
    std::atomic<int> ran{0};
    std::atomic<bool> worker_threw{false};
    const std::thread::id caller = std::this_thread::get_id();
    EXPECT_THROW(pool.run(64,
                          [&](int64_t i) {
                            ran.fetch_add(1);
                            // Thrown by whichever thread takes a task first other than the
                            // caller, else by the caller's last task: every round throws.
                            if ((std::this_thread::get_id() != caller && !worker_threw.exchange(true)) || i == 63) {
                              throw std::bad_alloc();
                            }
                            std::this_thread::sleep_for(std::chrono::microseconds(50));
                          }),
                 std::bad_alloc);
    EXPECT_LE(ran.load(), 64);
    std::atomic<int> after{0};
    pool.run(64, [&](int64_t) { after.fetch_add(1); });
    EXPECT_EQ(after.load(), 64) << "round " << round;
  }
}

}  // namespace
}  // namespace kvlm
