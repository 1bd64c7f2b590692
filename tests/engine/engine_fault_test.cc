// Fault injection into the engine (core/fault_injection.h): a block allocation that fails in the
// middle of a prefill is answered like a full pool (preemption, then the same tokens as an
// unfaulted run), and a forward that runs out of host memory ends that step's requests with one
// clear error while the others complete exactly. Every run ends with every block back.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "engine/engine_test_util.h"

namespace kvlm {
namespace {

using Site = FaultInjection::Site;
using testing::random_prompt;
using testing::RequestOutput;

// What a request produced, and how many of its events were final (must be exactly one).
struct Observed {
  RequestOutput out;
  int num_final = 0;
};

TokenCallback observe(Observed& o) {
  TokenCallback collect = testing::collect_into(o.out);
  return [&o, collect](const TokenEvent& e) {
    collect(e);
    if (e.finish != FinishReason::kNone) ++o.num_final;
  };
}

class EngineFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = &testing::tiny_engine_model("tiny-mha");
    options_ = testing::small_pool_options();  // a 100-token prompt is prefilled in chunks
    faults_ = std::make_shared<FaultInjection>();
    options_.faults = faults_;

    const std::vector<TokenId> long_prompt = random_prompt(100, 512, 31);
    std::vector<TokenId> shares_prefix(long_prompt.begin(), long_prompt.begin() + 64);
    const std::vector<TokenId> tail = random_prompt(9, 512, 32);
    shares_prefix.insert(shares_prefix.end(), tail.begin(), tail.end());
    requests_ = {testing::greedy_request(random_prompt(5, 512, 33), 30),
                 testing::greedy_request(random_prompt(6, 512, 34), 30),
                 testing::greedy_request(long_prompt, 10),
                 testing::greedy_request(shares_prefix, 12)};  // attaches the long prompt's blocks
    RequestOptions windowed = testing::greedy_request(random_prompt(40, 512, 35), 20);
    windowed.eviction.policy = EvictionPolicy::kStreaming;  // evicts and compacts
    windowed.eviction.budget = 24;
    windowed.eviction.sinks = 2;
    requests_.push_back(windowed);
    for (const RequestOptions& r : requests_) alone_.push_back(testing::run_alone(*model_, options_, r).tokens);
  }
  LlamaModel* model_ = nullptr;
  ThreadPool pool_{2};
  EngineOptions options_;
  std::shared_ptr<FaultInjection> faults_;
  std::vector<RequestOptions> requests_;
  std::vector<std::vector<TokenId>> alone_;  // each request's tokens when it runs alone, unfaulted
};

TEST_F(EngineFaultTest, ABlockAllocationFailingMidPrefillPreemptsAndTheRequestResumesExactly) {
  auto engine = Engine::create(*model_, pool_, options_).value();
  std::vector<Observed> seen(3);
  for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(engine->submit(requests_[i], observe(seen[i])).ok());
  engine->step();  // the two short prompts, and the long prompt's first chunk of 21 tokens
  ASSERT_TRUE(seen[2].out.tokens.empty());
  ASSERT_LT(engine->metrics().tokens_computed, 100);
  // Its next chunk of 30 tokens needs 7 more blocks: the third of them fails, with 50+ free.
  faults_->fail_after(Site::kBlockAllocation, 2);
  engine->step();
  EXPECT_EQ(faults_->num_fired(Site::kBlockAllocation), 1);
  EXPECT_EQ(engine->metrics().preemptions, 1);
  engine->cache().check_invariants();
  EXPECT_EQ(engine->leaked_blocks(), 0);
  engine->run_until_idle();
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(seen[i].num_final, 1) << "request " << i;
    EXPECT_EQ(seen[i].out.finish, FinishReason::kLength) << "request " << i << ": " << seen[i].out.error;
    EXPECT_EQ(seen[i].out.tokens, alone_[i]) << "request " << i;
  }
  EXPECT_EQ(seen[2].out.stats.preemptions, 1);
  // It resumed from its own published blocks instead of recomputing the whole prompt.
  EXPECT_LT(engine->metrics().tokens_computed, 100 + 10 + 2 * (5 + 30) + 21);
  testing::expect_every_block_back(*engine);
}

// Every allocation of a mixed run (short and long prompts, a shared prefix, an evicting request)
// fails once in turn: wherever it lands, the outputs are those of the unfaulted run.
TEST_F(EngineFaultTest, AnyOneFailedBlockAllocationLeavesEveryOutputExact) {
  int num_runs = 0;
  for (int64_t k = 0;; ++k) {
    auto faults = std::make_shared<FaultInjection>();
    EngineOptions options = options_;
    options.faults = faults;
    auto engine = Engine::create(*model_, pool_, options).value();
    faults->fail_after(Site::kBlockAllocation, k);
    std::vector<Observed> seen(requests_.size());
    for (size_t i = 0; i < requests_.size(); ++i) ASSERT_TRUE(engine->submit(requests_[i], observe(seen[i])).ok());
    while (engine->step()) {
      engine->cache().check_invariants();
      ASSERT_EQ(engine->leaked_blocks(), 0) << "fault at allocation " << k;
    }
    for (size_t i = 0; i < requests_.size(); ++i) {
      EXPECT_EQ(seen[i].num_final, 1) << "fault at allocation " << k << ", request " << i;
      EXPECT_EQ(seen[i].out.finish, FinishReason::kLength) << "fault at " << k << ": " << seen[i].out.error;
      EXPECT_EQ(seen[i].out.tokens, alone_[i]) << "fault at allocation " << k << ", request " << i;
    }
    testing::expect_every_block_back(*engine);
    if (faults->num_fired(Site::kBlockAllocation) == 0) break;  // k is past the run's last allocation
    ++num_runs;
    ASSERT_LT(k, 1000) << "the run never stops allocating";
  }
  EXPECT_GT(num_runs, 20);
}

TEST_F(EngineFaultTest, AForwardOutOfMemoryEndsThatStepsRequestsWithOneClearError) {
  EngineOptions options = options_;
  options.max_seqs = 2;  // the third request waits, outside the failing step
  auto engine = Engine::create(*model_, pool_, options).value();
  std::vector<Observed> seen(3);
  for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(engine->submit(requests_[i + 1], observe(seen[i])).ok());
  engine->step();  // two prompts start; the long one (requests_[2]) waits for a slot
  ASSERT_TRUE(seen[0].out.tokens.size() == 1 && seen[1].out.tokens.empty());
  faults_->fail_after(Site::kStepForward, 0);
  engine->step();
  EXPECT_EQ(faults_->num_fired(Site::kStepForward), 1);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(seen[i].num_final, 1) << "request " << i;
    EXPECT_EQ(seen[i].out.finish, FinishReason::kError) << "request " << i;
    EXPECT_NE(seen[i].out.error.find("out of memory in the forward pass"), std::string::npos) << seen[i].out.error;
  }
  EXPECT_EQ(engine->metrics().requests_failed, 2);
  EXPECT_EQ(engine->leaked_blocks(), 0);

  // The engine carries on: the waiting request and a new one complete as if nothing happened.
  Observed later;
  ASSERT_TRUE(engine->submit(requests_[0], observe(later)).ok());
  engine->run_until_idle();
  EXPECT_EQ(seen[2].num_final, 1);
  EXPECT_EQ(seen[2].out.finish, FinishReason::kLength) << seen[2].out.error;
  EXPECT_EQ(seen[2].out.tokens, alone_[3]);
  EXPECT_EQ(later.num_final, 1);
  EXPECT_EQ(later.out.tokens, alone_[0]);
  testing::expect_every_block_back(*engine);
}

}  // namespace
}  // namespace kvlm
