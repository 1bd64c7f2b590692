// Shared fixtures for the eviction tests: tiny synthetic models, token streams, the oracle's
// visibility rules and policy options.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/rng.h"
#include "core/thread_pool.h"
#include "evict/evicting_sequence.h"
#include "evict/eviction_options.h"
#include "model/llama_model.h"
#include "model/model_synthesizer.h"
#include "reference/reference_forward.h"
#include "support/test_paths.h"

namespace kvlm::testing {

// A synthesized preset, loaded once per test binary.
inline LlamaModel& eviction_test_model(const std::string& preset) {
  static std::map<std::string, std::unique_ptr<LlamaModel>> models;
  auto& slot = models[preset];
  if (!slot) {
    SynthOptions options;
    options.shape = synth_preset(preset).value();
    options.out_path = (scratch_dir("evict_" + preset) / "model.gguf").string();
    EXPECT_TRUE(synthesize_model(options).ok());
    slot = LlamaModel::load(options.out_path).value();
  }
  return *slot;
}

inline std::vector<TokenId> random_tokens(int n, int vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<TokenId> tokens(static_cast<size_t>(n));
  for (TokenId& t : tokens) t = static_cast<TokenId>(rng.next_u64() % static_cast<uint64_t>(vocab));
  return tokens;
}

// What window and streaming must keep for query t, and where its sink query is rotated.
inline ReferenceVisibility contiguous_rule(const EvictionOptions& o) {
  const int sinks = o.policy == EvictionPolicy::kStreaming ? o.sinks : 0;
  const int budget = o.budget;
  ReferenceVisibility v;
  v.visible = [=](int64_t t, int64_t s) { return s > t - (budget - sinks) || (t >= budget && s < sinks) ||
                                                 t < budget; };
  v.query_position = [=](int64_t t, int64_t s) { return (t >= budget && s < sinks) ? budget - 1 : t; };
  return v;
}

// Full causal attention for the prompt, then the live positions recorded after each decode step.
inline ReferenceVisibility recorded_rule(const std::vector<std::vector<int64_t>>& live, int prompt_len) {
  std::vector<std::set<int64_t>> sets;
  for (const auto& positions : live) sets.emplace_back(positions.begin(), positions.end());
  ReferenceVisibility v;
  v.visible = [sets, prompt_len](int64_t t, int64_t s) {
    return t < prompt_len || sets[static_cast<size_t>(t - prompt_len)].count(s) > 0;
  };
  return v;
}

// The policies' options the tests share: 4 sinks, a SnapKV window of 6 and kernel of 3.
inline EvictionOptions test_policy(EvictionPolicy p, int budget) {
  EvictionOptions o;
  o.policy = p;
  o.budget = budget;
  o.sinks = 4;
  o.snapkv_window = 6;
  o.snapkv_kernel = 3;
  return o;
}

// Feeds `tokens` one forward each and returns every step's last-row logits, concatenated.
inline std::vector<float> feed_one_by_one(EvictingSequence& sequence, std::span<const TokenId> tokens,
                                          ThreadPool& pool) {
  std::vector<float> all, logits;
  for (TokenId t : tokens) {
    EXPECT_TRUE(sequence.forward(std::span<const TokenId>(&t, 1), LogitsRows::kLast, pool, logits).ok());
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

}  // namespace kvlm::testing
