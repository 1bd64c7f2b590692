// The engine's central promise: a request's output does not depend on how it was scheduled —
// alone, batched with up to 32 others of mixed lengths, with or without prefix hits, preempted
// and resumed in a tiny pool, or interleaved with cancellations; for several model shapes,
// codecs, an eviction policy on some requests and seeded sampling.
#include <gtest/gtest.h>

#include <set>

#include "engine/engine_test_util.h"
#include "reference/reference_forward.h"

namespace kvlm {
namespace {

using testing::collect_into;
using testing::random_prompt;
using testing::relative_difference;
using testing::RequestOutput;
using testing::run_alone;

struct ScheduleCase {
  std::string preset;
  KvType k_type = KvType::kF32;
  KvType v_type = KvType::kF32;
};

std::string case_name(const ::testing::TestParamInfo<ScheduleCase>& info) {
  std::string name = info.param.preset + "_" + std::string(kv_type_name(info.param.k_type)) + "_" +
                     std::string(kv_type_name(info.param.v_type));
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

LlamaModel* model_for(const std::string& preset) {
  if (preset == "stories260K") {
    static std::unique_ptr<LlamaModel> stories;
    if (!stories) {
      auto path = testing::shared_file("stories260K.gguf");
      if (!path) return nullptr;
      stories = LlamaModel::load(path->string()).value();
    }
    return stories.get();
  }
  return &testing::tiny_engine_model(preset);
}

// 33 requests: prompts of 3..~120 tokens, several sharing long prefixes, greedy and seeded
// sampling, a streaming policy on every fifth, different priorities.
std::vector<RequestOptions> mixed_requests(const LlamaModel& model) {
  const int vocab = model.config().vocab_size;
  const std::vector<TokenId> shared = random_prompt(70, vocab, 99);
  std::vector<RequestOptions> requests;
  for (int i = 0; i < 33; ++i) {
    RequestOptions r;
    const int len = 3 + (i * 37) % 110;
    r.prompt = random_prompt(len, vocab, 1000 + static_cast<uint64_t>(i));
    if (i % 3 == 0) {  // a shared prefix of 70 tokens, then its own tail
      std::vector<TokenId> p = shared;
      p.insert(p.end(), r.prompt.begin(), r.prompt.begin() + std::min<ptrdiff_t>(len, 20));
      r.prompt = p;
    }
    r.max_tokens = 4 + (i * 13) % 30;
    r.stop_at_eos = false;
    r.sampler.temperature = i % 2 == 0 ? 0.0f : 0.9f;
    r.sampler.seed = 7 + static_cast<uint64_t>(i);
    r.priority = i % 4 == 1 ? 1 : 0;
    if (i % 5 == 2) {
      r.eviction.policy = EvictionPolicy::kStreaming;
      r.eviction.budget = 48;
      r.eviction.sinks = 4;
    }
    r.logits = LogitsCapture::kSampled;
    requests.push_back(r);
  }
  return requests;
}

class EngineScheduleTest : public ::testing::TestWithParam<ScheduleCase> {
 protected:
  void SetUp() override {
    model_ = model_for(GetParam().preset);
    if (model_ == nullptr) GTEST_SKIP() << "shared model stories260K.gguf not found (set KVLM_SHARED)";
    base_.k_type = GetParam().k_type;
    base_.v_type = GetParam().v_type;
    base_.block_size = 8;
    base_.max_batch_tokens = 64;
    base_.num_blocks = 4096;
    base_.storage.kivi_residual_tokens = 128;  // the CLI's default
    requests_ = mixed_requests(*model_);
    for (const RequestOptions& r : requests_) solo_.push_back(run_alone(*model_, base_, r));
  }

  // Logits may differ by f32 rounding (matmuls over other batch shapes, attention splits);
  // KIVI also by where a block was sealed, which depends on the step boundaries.
  double logits_bound() const {
    const bool kivi = GetParam().k_type == KvType::kKivi4 || GetParam().v_type == KvType::kKivi4;
    return kivi ? 5e-2 : 1e-5;
  }

  // Every request must produce the solo tokens and logits (unless `cancelled` says it was cut).
  void expect_same_as_alone(const std::vector<RequestOutput>& outputs, const std::set<size_t>& cancelled = {}) {
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (cancelled.contains(i)) continue;
      EXPECT_EQ(outputs[i].finish, FinishReason::kLength) << "request " << i << ": " << outputs[i].error;
      EXPECT_EQ(outputs[i].tokens, solo_[i].tokens) << "request " << i << " cached " << outputs[i].stats.cached_prompt_tokens << " preempted " << outputs[i].stats.preemptions;
      EXPECT_EQ(outputs[i].text, solo_[i].text) << "request " << i;
      ASSERT_EQ(outputs[i].logits.size(), solo_[i].logits.size()) << "request " << i;
      EXPECT_LE(relative_difference(outputs[i].logits, solo_[i].logits), logits_bound()) << "request " << i;
    }
  }

  void expect_no_leaks(const Engine& engine) {
    engine.cache().check_invariants();
    EXPECT_EQ(engine.leaked_blocks(), 0);
    EXPECT_EQ(engine.cache().num_used_blocks(), 0);
    EXPECT_EQ(engine.metrics().requests_running, 0);
  }

  LlamaModel* model_ = nullptr;
  EngineOptions base_;
  std::vector<RequestOptions> requests_;
  std::vector<RequestOutput> solo_;
};

TEST_P(EngineScheduleTest, BatchedWithPrefixHitsMatchesAlone) {
  ThreadPool pool(2);
  auto engine = Engine::create(*model_, pool, base_).value();
  std::vector<RequestOutput> outputs(requests_.size());
  // Half now, the rest while the first half runs (prefixes published in flight are hit).
  for (size_t i = 0; i < requests_.size(); ++i) {
    if (i == requests_.size() / 2) {
      for (int s = 0; s < 3; ++s) engine->step();
    }
    ASSERT_TRUE(engine->submit(requests_[i], collect_into(outputs[i])).ok());
  }
  engine->run_until_idle();
  expect_same_as_alone(outputs);
  // KIVI publishes a block once sealed, 128 tokens behind: these requests are too short for that
  // (EnginePrefixTest.KiviBlocksArePublishedWhenSealed covers it).
  const bool kivi = GetParam().k_type == KvType::kKivi4 || GetParam().v_type == KvType::kKivi4;
  if (!kivi) {
    EXPECT_GT(engine->metrics().prefix_hit_tokens, 0);
  }
  expect_no_leaks(*engine);
}

TEST_P(EngineScheduleTest, PreemptedInATinyPoolMatchesAlone) {
  ThreadPool pool(2);
  EngineOptions tiny = base_;
  int largest = 0;
  for (const RequestOptions& r : requests_) {
    largest = std::max(largest, EvictingSequence::max_blocks(r.eviction, tiny.block_size, tiny.max_batch_tokens,
                                                             static_cast<int64_t>(r.prompt.size()) + r.max_tokens));
  }
  tiny.num_blocks = largest + 4;
  auto engine = Engine::create(*model_, pool, tiny).value();
  std::vector<RequestOutput> outputs(requests_.size());
  for (size_t i = 0; i < requests_.size(); ++i) {
    ASSERT_TRUE(engine->submit(requests_[i], collect_into(outputs[i])).ok());
  }
  engine->run_until_idle();
  EXPECT_GT(engine->metrics().preemptions, 0);
  expect_same_as_alone(outputs);
  expect_no_leaks(*engine);
}

TEST_P(EngineScheduleTest, CancellationsLeaveTheOthersUnchanged) {
  ThreadPool pool(2);
  EngineOptions small = base_;
  small.num_blocks = 160;
  auto engine = Engine::create(*model_, pool, small).value();
  std::vector<RequestOutput> outputs(requests_.size());
  std::vector<RequestId> ids;
  for (size_t i = 0; i < requests_.size(); ++i) {
    ids.push_back(engine->submit(requests_[i], collect_into(outputs[i])).value());
  }
  // Some at once (waiting or in prefill), some after a few steps (in decode).
  const std::set<size_t> cancelled = {1, 4, 9, 16, 25};
  EXPECT_TRUE(engine->cancel(ids[1]));
  EXPECT_TRUE(engine->cancel(ids[25]));
  for (int s = 0; s < 6; ++s) engine->step();
  for (size_t i : {4, 9, 16}) engine->cancel(ids[i]);
  engine->run_until_idle();
  for (size_t i : cancelled) {
    EXPECT_TRUE(outputs[i].finish == FinishReason::kCancelled || outputs[i].finish == FinishReason::kLength)
        << "request " << i;
  }
  EXPECT_EQ(outputs[1].finish, FinishReason::kCancelled);
  EXPECT_FALSE(engine->cancel(ids[1]));  // already over
  expect_same_as_alone(outputs, cancelled);
  expect_no_leaks(*engine);
}

INSTANTIATE_TEST_SUITE_P(Shapes, EngineScheduleTest,
                         ::testing::Values(ScheduleCase{"tiny-mha"}, ScheduleCase{"tiny-gqa"}, ScheduleCase{"tiny-mqa"},
                                           ScheduleCase{"stories260K"},
                                           ScheduleCase{"tiny-gqa", KvType::kInt8, KvType::kInt8},
                                           ScheduleCase{"tiny-gqa", KvType::kKivi4, KvType::kKivi4},
                                           ScheduleCase{"stories260K", KvType::kInt8, KvType::kInt8}),
                         case_name);

// The engine's own logits, alone and batched, stay within the existing bound of the no-cache
// double-precision reference (F32 weights and cache).
TEST(EngineReference, BatchedLogitsMatchTheNoCacheForward) {
  LlamaModel& model = testing::tiny_engine_model("tiny-gqa");
  ThreadPool pool(2);
  EngineOptions options;
  options.k_type = options.v_type = KvType::kF32;
  options.block_size = 4;
  options.num_blocks = 512;
  options.max_batch_tokens = 24;
  auto engine = Engine::create(model, pool, options).value();
  std::vector<RequestOutput> outputs(6);
  std::vector<RequestOptions> requests;
  for (int i = 0; i < 6; ++i) {
    RequestOptions r;
    r.prompt = random_prompt(5 + 11 * i, model.config().vocab_size, 50 + static_cast<uint64_t>(i));
    r.max_tokens = 12;
    r.stop_at_eos = false;
    r.sampler.temperature = 0;
    r.logits = LogitsCapture::kAll;
    requests.push_back(r);
    ASSERT_TRUE(engine->submit(r, collect_into(outputs[static_cast<size_t>(i)])).ok());
  }
  engine->run_until_idle();
  const size_t vocab = static_cast<size_t>(model.config().vocab_size);
  for (size_t i = 0; i < requests.size(); ++i) {
    std::vector<TokenId> all = requests[i].prompt;
    all.insert(all.end(), outputs[i].tokens.begin(), outputs[i].tokens.end());
    all.pop_back();  // the last token is sampled, never forwarded
    ASSERT_EQ(outputs[i].logits.size(), all.size() * vocab) << "request " << i;
    const std::vector<double> expected = reference_logits(model.config(), model.weights(), all);
    EXPECT_LE(max_relative_error(outputs[i].logits, expected), 1e-4) << "request " << i;
  }
}

}  // namespace
}  // namespace kvlm
