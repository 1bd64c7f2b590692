// Shared fixtures for the engine tests: tiny synthetic models and running requests to the end.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "engine/engine.h"
#include "model/llama_model.h"
#include "model/model_synthesizer.h"
#include "support/test_paths.h"

namespace kvlm::testing {

inline LlamaModel& tiny_engine_model(const std::string& preset) {
  static std::map<std::string, std::unique_ptr<LlamaModel>> models;
  auto& slot = models[preset];
  if (!slot) {
    SynthOptions options;
    options.shape = synth_preset(preset).value();
    options.out_path = (scratch_dir("engine_" + preset) / "model.gguf").string();
    EXPECT_TRUE(synthesize_model(options).ok());
    slot = LlamaModel::load(options.out_path).value();
  }
  return *slot;
}

// The small paged pool the pool and fault tests share: tiny blocks (4 tokens) in a pool of 64 and a
// 32-token step budget, so prompts span many blocks and long ones are prefilled in chunks.
inline EngineOptions small_pool_options() {
  EngineOptions options;
  options.k_type = options.v_type = KvType::kF16;
  options.block_size = 4;
  options.num_blocks = 64;
  options.max_batch_tokens = 32;
  return options;
}

inline std::vector<TokenId> random_prompt(int n, int vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<TokenId> tokens(static_cast<size_t>(n));
  for (TokenId& t : tokens) t = static_cast<TokenId>(1 + rng.next_u64() % static_cast<uint64_t>(vocab - 1));
  return tokens;
}

// A greedy request of exactly max_tokens new tokens (EOS does not stop it).
inline RequestOptions greedy_request(std::vector<TokenId> prompt, int max_tokens, std::string salt = {}) {
  RequestOptions r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.stop_at_eos = false;
  r.sampler.temperature = 0;
  r.cache_salt = std::move(salt);
  return r;
}

// What one request produced, gathered from its events.
struct RequestOutput {
  std::vector<TokenId> tokens;        // generated
  std::string text;
  std::vector<float> logits;          // captured rows, in order
  FinishReason finish = FinishReason::kNone;
  std::string error;
  RequestStats stats;
  int num_events = 0;
};

inline TokenCallback collect_into(RequestOutput& out) {
  return [&out](const TokenEvent& e) {
    ++out.num_events;
    if (e.token >= 0) out.tokens.push_back(e.token);
    out.text += e.text;
    if (e.logits) out.logits.insert(out.logits.end(), e.logits->begin(), e.logits->end());
    if (e.finish != FinishReason::kNone) {
      out.finish = e.finish;
      out.error = e.error;
      if (e.stats) out.stats = *e.stats;
    }
  };
}

// The request alone in a pool big enough for it: the yardstick every schedule must match.
inline RequestOutput run_alone(LlamaModel& model, const EngineOptions& options, const RequestOptions& request) {
  ThreadPool pool(2);
  EngineOptions solo = options;
  solo.prefix_caching = false;
  auto engine = Engine::create(model, pool, solo).value();
  RequestOutput out;
  auto id = engine->submit(request, collect_into(out));
  EXPECT_TRUE(id.ok()) << id.status().message();
  engine->run_until_idle();
  EXPECT_EQ(engine->leaked_blocks(), 0);
  return out;
}

// After a run: the pool's invariants hold, no block is used or leaked, every ref count is 0.
inline void expect_every_block_back(const Engine& engine) {
  engine.cache().check_invariants();
  EXPECT_EQ(engine.cache().num_used_blocks(), 0);
  EXPECT_EQ(engine.leaked_blocks(), 0);
  for (int b = 0; b < engine.cache().num_blocks(); ++b) EXPECT_EQ(engine.cache().pool().ref_count(BlockId(b)), 0);
}

// Largest |a - b| over the largest |b| (the rows are compared as one vector).
inline double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return scale > 0 ? worst / scale : worst;
}

}  // namespace kvlm::testing
