// EvictionOptions: which token-eviction policy a sequence runs under and with what budget.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "core/status.h"

namespace kvlm {

// What a policy drops once the cache holds `budget` tokens (docs/ARCHITECTURE.md, "Token eviction"):
enum class EvictionPolicy {
  kNone,       // keep every token (the full cache)
  kWindow,     // the most recent `budget` tokens
  kStreaming,  // StreamingLLM: the first `sinks` tokens + the most recent budget - sinks
  kH2o,        // Heavy-Hitter Oracle: the `recent` newest + the largest accumulated attention
  kSnapKv,     // SnapKV: after each prompt step, the prompt tokens the observation window attends to most
};

const char* eviction_policy_name(EvictionPolicy policy);
// "none", "window", "streaming", "h2o" or "snapkv"; an error naming the choices otherwise.
Result<EvictionPolicy> parse_eviction_policy(std::string_view name);
// Every policy, kNone first.
std::span<const EvictionPolicy> all_eviction_policies();

// One decision is made per sequence and shared by every layer and kv head: a single block table
// addresses all layers, so per-layer or per-head choices would need a table (and blocks) each.
// H2O and SnapKV therefore score a token by its attention summed over all layers and heads.
struct EvictionOptions {
  EvictionPolicy policy = EvictionPolicy::kNone;
  int budget = 0;          // most tokens attention sees, new tokens included (0 with kNone)
  int sinks = 4;           // streaming: the first tokens, always kept
  int recent = 0;          // h2o: the newest tokens, always kept; 0 = budget / 2 (the paper's split)
  int snapkv_window = 32;  // snapkv: the last prompt tokens whose attention votes (and which are kept)
  int snapkv_kernel = 7;   // snapkv: votes are max-pooled over this many neighbouring positions (odd)
  // Tokens per forward once the budget is reached: before each such step the policy evicts that
  // many. 1 is eviction token by token, as in the papers; larger steps run faster, each of their
  // queries seeing a little less than the budget.
  int evicting_step = 1;

  int h2o_recent() const { return recent > 0 ? recent : budget / 2; }
};

// Errors name the flag: a budget < 1 with a policy, sinks >= budget, recent >= budget,
// snapkv_window >= budget, an even or non-positive kernel, evicting_step outside [1, budget - what
// the policy always keeps] (streaming's sinks, H2O's recent window).
Status validate_eviction_options(const EvictionOptions& options);

// The fields of EvictionOptions a user sets, each read by some policies only.
enum class EvictionField {
  kBudget,        // every policy but kNone
  kSinks,         // streaming
  kRecent,        // h2o
  kSnapKvWindow,  // snapkv
  kSnapKvKernel,  // snapkv
  kEvictingStep,  // every policy but kNone
};

// The flag that sets `field` ("--budget", "--sinks", "--h2o-recent", ...), as the errors name it.
const char* eviction_field_flag(EvictionField field);
// Whether `policy` reads `field`; a field it does not read keeps its default unused.
bool eviction_policy_reads(EvictionPolicy policy, EvictionField field);
// An error naming the flag, the policy and the policies that read it when one of `fields_set`
// (the fields the user chose explicitly) is one `policy` ignores: a setting that would do nothing
// is a mistake to report, not a value to drop quietly.
Status validate_eviction_fields_set(EvictionPolicy policy, std::span<const EvictionField> fields_set);

// "streaming (4 sinks + 252 recent, budget 256)"-style summary for reports and logs.
std::string describe_eviction(const EvictionOptions& options);

}  // namespace kvlm
