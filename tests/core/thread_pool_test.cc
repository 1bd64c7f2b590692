#include "core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <new>
#include <numeric>
#include <thread>
#include <utility>
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
// Tapering chunks cover the range once, in order, each at least min_chunk but the last, each
// no longer than the one before, and fall to min_chunk at the end; on one thread too.
TEST(ThreadPool, TaperedChunksShrinkAndCoverRangeExactly) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 7, 256, 1000}) {
      for (int64_t min_chunk : {1, 4, 300}) {
        SCOPED_TRACE(::testing::Message() << threads << " threads, n " << n << ", min_chunk " << min_chunk);
        std::mutex mutex;
        std::vector<std::pair<int64_t, int64_t>> chunks;
        pool.parallel_for_tapered(n, min_chunk, [&](int64_t begin, int64_t end) {
          std::lock_guard<std::mutex> lock(mutex);
          chunks.emplace_back(begin, end);
        });
        std::sort(chunks.begin(), chunks.end());
        ASSERT_FALSE(chunks.empty());
        int64_t next = 0;
        for (size_t i = 0; i < chunks.size(); ++i) {
          const auto [begin, end] = chunks[i];
          ASSERT_EQ(begin, next);
          ASSERT_GT(end, begin);
          if (i + 1 < chunks.size()) {
            EXPECT_GE(end - begin, min_chunk);
          }
          if (i > 0) {
            EXPECT_LE(end - begin, chunks[i - 1].second - chunks[i - 1].first);
          }
          next = end;
        }
        EXPECT_EQ(next, n);
        const int64_t last = chunks.back().second - chunks.back().first;
        EXPECT_LE(last, std::min(n, min_chunk));
        // The first chunk is a 1/(2·threads) share, so a long range is split in many.
        if (n >= 256 && min_chunk == 1) {
          EXPECT_EQ(chunks.front().second, (n + 2 * threads - 1) / (2 * threads));
        }
      }
    }
  }
}

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
