// KvAdvisor: picks a KV configuration for a stated scenario from a Plan, with reasons in numbers.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "kv/kv_type.h"
#include "plan/kv_planner.h"

namespace kvlm {

enum class Scenario {
  kLimitedMemory,  // an existing model, little memory
  kLongChat,       // a long streaming chat
  kLongRecall,     // exact recall over a long document
  kConcurrency,    // a target number of concurrent sequences (--batch)
};

std::optional<Scenario> parse_scenario(std::string_view name);  // "limited-memory", ...
std::string_view scenario_name(Scenario scenario);
std::string scenario_list();  // "limited-memory, long-chat, long-recall, concurrency"

// How much a codec loses, from the bits it stores per value (its own block bytes, so
// scales and zero points count): a codec added to kv/ is rated without editing this file.
// Within a tier and size, the measured round-trip error breaks ties (int8 before fp8).
enum class QualityTier {
  kExact,         // >= 32 bits: the reference
  kLossless,      // >= 16 bits (f16, bf16): indistinguishable for 16-bit models
  kNearLossless,  // >= 8 bits (int8 per token, fp8): ≈ lossless in published KV studies
  kFourBit,       // >= 4 bits (int4 per group): small, measurable loss
  kTwoBit,        // < 4 bits (KIVI 2-bit): needs per-channel keys to hold up
};
struct CodecQuality {
  QualityTier tier = QualityTier::kExact;
  double bits_per_value = 0;      // stored bits per value, mean of K and V, scales included
  double relative_rms_error = 0;  // encode→decode of a fixed test block, worse of K and V roles
};
CodecQuality codec_quality(KvType type);
std::string_view quality_tier_name(QualityTier tier);

struct Advice {
  Scenario scenario = Scenario::kLimitedMemory;
  // Index into plan.rows of the recommended option; nullopt when nothing fits.
  std::optional<size_t> chosen_row;
  std::string recommendation;          // one line: what to run
  std::vector<std::string> reasons;    // why, with the computed numbers
  std::vector<std::string> not_available;  // what the guidance prefers but this build or plan lacks
};

// StreamingLLM's attention sinks in the options the advisor adds (the paper's 4).
inline constexpr int kAdviceSinks = 4;

// The plan the advice reads: make_plan(shape, request) plus the eviction rows the scenario may
// recommend (every codec under streaming with kAdviceSinks sinks):
//  - long-chat, unless the request has streaming rows: at a budget of min(ctx, the trained
//    context), lowered to what fits --memory with the smallest codec of 8 bits or more (unless
//    that is under 256 tokens: then advise() reports that nothing fits);
//  - limited-memory and concurrency, when the request has no eviction rows, --memory is set and
//    no full cache fits: at the largest budget (< ctx) for which that codec fits, if that is
//    at least 256 tokens (less is too little of a text to recommend);
//  - long-recall: none (recall must not evict).
Result<Plan> make_advice_plan(const ModelShape& shape, const PlanRequest& request, Scenario scenario);

// Follows the scenario guidance over plan.rows (never the baseline row). Only options the
// plan holds are recommended, so only codecs in all_kv_types() and the plan's policies.
// long-chat picks a streaming row (the full cache when the plan has none); long-recall never an
// evicting one; limited-memory and concurrency take an evicting row only when no full cache fits.
// limited-memory needs plan.request.memory_bytes (an error otherwise); the others use it when present.
Result<Advice> advise(const Plan& plan, Scenario scenario);

}  // namespace kvlm
