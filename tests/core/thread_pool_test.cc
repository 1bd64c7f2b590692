#include "core/thread_pool.h"

#include <atomic>
#include <numeric>
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

}  // namespace
}  // namespace kvlm
