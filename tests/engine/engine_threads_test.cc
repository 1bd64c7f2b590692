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

// Submitters, cancellers that cancel other threads' requests (finished ones and ids that were
// never issued too) and metrics readers, all at once, with prefix sharing between the prompts.
TEST(EngineThreads, CancellationFromOtherThreadsWhileSubmittingAndReading) {
  LlamaModel& model = testing::tiny_engine_model("tiny-gqa");
  ThreadPool pool(2);
  EngineOptions options;
  options.block_size = 8;
  options.num_blocks = 64;
  options.max_batch_tokens = 48;
  auto engine = Engine::create(model, pool, options).value();
  engine->start();

  FinalEvents events;
  constexpr int kSubmitters = 6;
  constexpr int kPerThread = 10;
  std::mutex ids_mutex;
  std::vector<RequestId> ids;  // every accepted id, in the order submitters got them
  std::atomic<int> submitters_left{kSubmitters};
  std::vector<std::thread> threads;
  const std::vector<TokenId> shared_prefix = random_prompt(24, 512, 7);
  for (int t = 0; t < kSubmitters; ++t) {
    threads.emplace_back([&, t] {
      struct Leaving {  // also when an assertion returns early
        std::atomic<int>& left;
        ~Leaving() { --left; }
      } leaving{submitters_left};
      Rng rng(300 + static_cast<uint64_t>(t));
      for (int i = 0; i < kPerThread; ++i) {
        RequestOptions r;
        r.prompt = shared_prefix;
        const std::vector<TokenId> tail = random_prompt(1 + static_cast<int>(rng.next_u64() % 40), 512, rng.next_u64());
        r.prompt.insert(r.prompt.end(), tail.begin(), tail.end());
        r.max_tokens = 8 + static_cast<int>(rng.next_u64() % 64);
        r.stop_at_eos = false;
        r.sampler.temperature = 0;
        auto id = engine->submit(r, events.callback());
        ASSERT_TRUE(id.ok()) << id.status().message();
        std::lock_guard<std::mutex> lock(ids_mutex);
        ids.push_back(*id);
      }
    });
  }
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  auto all_ended = [&] {
    std::lock_guard<std::mutex> lock(events.mutex);
    return (submitters_left.load() == 0 && events.num_final == kSubmitters * kPerThread) ||
           std::chrono::steady_clock::now() > give_up;
  };
  for (int t = 0; t < 2; ++t) {  // cancellers: any id, whoever submitted it, in any state
    threads.emplace_back([&, t] {
      Rng rng(900 + static_cast<uint64_t>(t));
      while (!all_ended()) {
        RequestId victim{-1};
        {
          std::lock_guard<std::mutex> lock(ids_mutex);
          if (!ids.empty()) victim = ids[rng.next_u64() % ids.size()];
        }
        if (rng.next_u64() % 8 == 0) victim = RequestId{1 << 30};  // never issued
        if (victim.value >= 0) engine->cancel(victim);
        std::this_thread::sleep_for(std::chrono::microseconds(300));
      }
    });
  }
  threads.emplace_back([&] {  // a metrics reader, as /metrics is
    while (submitters_left.load() > 0) {
      const EngineMetrics m = engine->metrics();
      EXPECT_GE(m.blocks_used, 0);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  for (auto& th : threads) th.join();
  const int accepted = static_cast<int>(ids.size());
  {
    std::unique_lock<std::mutex> lock(events.mutex);
    ASSERT_TRUE(events.done.wait_for(lock, std::chrono::seconds(120), [&] { return events.num_final == accepted; }))
        << events.num_final << " of " << accepted << " requests ended";
  }
  engine->stop();
  EXPECT_EQ(accepted, kSubmitters * kPerThread);
  for (const auto& [id, n] : events.finals) EXPECT_EQ(n, 1) << "request " << id;
  const EngineMetrics m = engine->metrics();
  EXPECT_EQ(m.requests_finished + m.requests_cancelled, accepted);
  EXPECT_EQ(engine->cache().num_used_blocks(), 0);
  EXPECT_EQ(engine->leaked_blocks(), 0);
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
