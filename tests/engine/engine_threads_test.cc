// The engine on its own thread: submissions and cancellations from many threads at once, every
// request ending with exactly one final event, and stop() cancelling what is still in flight.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "engine/engine_test_util.h"

namespace kvlm {
namespace {

using testing::random_prompt;

// Final events per request id, shared by every submitting thread and the engine's thread.
struct FinalEvents {
  std::mutex mutex;
  std::condition_variable done;
  std::map<int32_t, int> finals;         // id -> final events seen
  std::map<int32_t, FinishReason> reason;
  std::map<int32_t, int> tokens;
  int num_final = 0;

  TokenCallback callback() {
    return [this](const TokenEvent& e) {
      std::lock_guard<std::mutex> lock(mutex);
      if (e.token >= 0) ++tokens[e.id.value];
      if (e.finish == FinishReason::kNone) return;
      ++finals[e.id.value];
      reason[e.id.value] = e.finish;
      ++num_final;
      done.notify_all();
    };
  }
};

TEST(EngineThreads, ManyThreadsSubmitAndCancelWhileTheEngineRuns) {
  LlamaModel& model = testing::tiny_engine_model("tiny-gqa");
  ThreadPool pool(2);
  EngineOptions options;
  options.block_size = 8;
  options.num_blocks = 96;  // tight: preemption happens under the load
  options.max_batch_tokens = 64;
  auto engine = Engine::create(model, pool, options).value();
  engine->start();

  FinalEvents events;
  constexpr int kThreads = 8;
  constexpr int kPerThread = 12;
  std::atomic<int> accepted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Rng rng(100 + static_cast<uint64_t>(t));
      std::vector<RequestId> mine;
      for (int i = 0; i < kPerThread; ++i) {
        RequestOptions r;
        r.prompt = random_prompt(1 + static_cast<int>(rng.next_u64() % 90), 512, rng.next_u64());
        r.max_tokens = 1 + static_cast<int>(rng.next_u64() % 30);
        r.stop_at_eos = false;
        r.sampler.temperature = 0;
        auto id = engine->submit(r, events.callback());
        ASSERT_TRUE(id.ok()) << id.status().message();
        ++accepted;
        mine.push_back(*id);
        if (rng.next_u64() % 3 == 0) engine->cancel(mine[rng.next_u64() % mine.size()]);
        if (rng.next_u64() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    });
  }
  for (auto& th : threads) th.join();
  {
    std::unique_lock<std::mutex> lock(events.mutex);
    ASSERT_TRUE(events.done.wait_for(lock, std::chrono::seconds(120),
                                     [&] { return events.num_final == accepted.load(); }))
        << events.num_final << " of " << accepted.load() << " requests ended";
  }
  engine->stop();
  EXPECT_EQ(accepted.load(), kThreads * kPerThread);
  for (const auto& [id, n] : events.finals) EXPECT_EQ(n, 1) << "request " << id;
  EXPECT_EQ(static_cast<int>(events.finals.size()), accepted.load());
  for (const auto& [id, why] : events.reason) {
    EXPECT_TRUE(why == FinishReason::kLength || why == FinishReason::kCancelled) << "request " << id;
  }
  const EngineMetrics m = engine->metrics();
  EXPECT_EQ(m.requests_finished + m.requests_cancelled, accepted.load());
  EXPECT_EQ(engine->cache().num_used_blocks(), 0);
  engine->cache().check_invariants();
}

TEST(EngineThreads, StopCancelsWhatIsStillInFlight) {
  LlamaModel& model = testing::tiny_engine_model("tiny-mha");
  ThreadPool pool(2);
  EngineOptions options;
  options.num_blocks = 256;
  auto engine = Engine::create(model, pool, options).value();
  FinalEvents events;
  for (int i = 0; i < 4; ++i) {
    RequestOptions r;
    r.prompt = random_prompt(20, 512, static_cast<uint64_t>(i));
    r.max_tokens = 200;
    r.stop_at_eos = false;
    ASSERT_TRUE(engine->submit(r, events.callback()).ok());
  }
  engine->step();  // admitted and running, not started on a thread
  engine->stop();
  EXPECT_EQ(events.num_final, 4);
  for (const auto& [id, why] : events.reason) EXPECT_EQ(why, FinishReason::kCancelled) << "request " << id;
  EXPECT_EQ(engine->cache().num_used_blocks(), 0);
}

}  // namespace
}  // namespace kvlm
