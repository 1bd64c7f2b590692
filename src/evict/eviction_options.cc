#include "evict/eviction_options.h"

#include <array>

#include <fmt/format.h>

namespace kvlm {
namespace {

constexpr std::array<EvictionPolicy, 5> kAllPolicies = {EvictionPolicy::kNone, EvictionPolicy::kWindow,
                                                         EvictionPolicy::kStreaming, EvictionPolicy::kH2o,
                                                         EvictionPolicy::kSnapKv};

}  // namespace

const char* eviction_policy_name(EvictionPolicy policy) {
  switch (policy) {
    case EvictionPolicy::kNone:
      return "none";
    case EvictionPolicy::kWindow:
      return "window";
    case EvictionPolicy::kStreaming:
      return "streaming";
    case EvictionPolicy::kH2o:
      return "h2o";
    case EvictionPolicy::kSnapKv:
      return "snapkv";
  }
  return "?";
}

Result<EvictionPolicy> parse_eviction_policy(std::string_view name) {
  for (EvictionPolicy p : kAllPolicies) {
    if (name == eviction_policy_name(p)) return p;
  }
  return Status::errorf("unknown eviction policy '{}' (choose none, window, streaming, h2o or snapkv)", name);
}

std::span<const EvictionPolicy> all_eviction_policies() { return kAllPolicies; }

Status validate_eviction_options(const EvictionOptions& o) {
  if (o.policy == EvictionPolicy::kNone) return Status::ok_status();
  const char* name = eviction_policy_name(o.policy);
  if (o.budget < 1) return Status::errorf("--policy {} needs --budget >= 1 (got {})", name, o.budget);
  if (o.budget > (1 << 28)) return Status::errorf("--budget {} is absurdly large", o.budget);
  int reserved = 0;  // tokens the policy always keeps besides the newest step
  switch (o.policy) {
    case EvictionPolicy::kStreaming:
      if (o.sinks < 0 || o.sinks >= o.budget) {
        return Status::errorf("--sinks {} must be in [0, --budget {})", o.sinks, o.budget);
      }
      reserved = o.sinks;
      break;
    case EvictionPolicy::kH2o:
      if (o.recent < 0 || o.h2o_recent() >= o.budget) {
        return Status::errorf("--h2o-recent {} must be in [0, --budget {})", o.h2o_recent(), o.budget);
      }
      reserved = o.h2o_recent();  // a step's victims come from the older tokens only
      break;
    case EvictionPolicy::kSnapKv:
      if (o.snapkv_window < 1 || o.snapkv_window >= o.budget) {
        return Status::errorf("--snapkv-window {} must be in [1, --budget {})", o.snapkv_window, o.budget);
      }
      if (o.snapkv_kernel < 1 || o.snapkv_kernel % 2 == 0) {
        return Status::errorf("--snapkv-kernel {} must be a positive odd number", o.snapkv_kernel);
      }
      break;
    case EvictionPolicy::kWindow:
    case EvictionPolicy::kNone:
      break;
  }
  if (o.evicting_step < 1 || o.evicting_step > o.budget - reserved) {
    return Status::errorf("--evict-step {} must be in [1, {}] (the budget less what {} always keeps)",
                          o.evicting_step, o.budget - reserved, name);
  }
  return Status::ok_status();
}

std::string describe_eviction(const EvictionOptions& o) {
  switch (o.policy) {
    case EvictionPolicy::kNone:
      return "none (full cache)";
    case EvictionPolicy::kWindow:
      return fmt::format("window (budget {})", o.budget);
    case EvictionPolicy::kStreaming:
      return fmt::format("streaming ({} sinks + {} recent, budget {})", o.sinks, o.budget - o.sinks, o.budget);
    case EvictionPolicy::kH2o:
      return fmt::format("h2o ({} recent + {} heavy hitters, budget {})", o.h2o_recent(), o.budget - o.h2o_recent(),
                         o.budget);
    case EvictionPolicy::kSnapKv:
      return fmt::format("snapkv (window {}, pool {}, budget {})", o.snapkv_window, o.snapkv_kernel, o.budget);
  }
  return "?";
}

}  // namespace kvlm
