#include "evict/eviction_options.h"

#include <array>
#include <vector>

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

const char* eviction_field_flag(EvictionField field) {
  switch (field) {
    case EvictionField::kBudget:
      return "--budget";
    case EvictionField::kSinks:
      return "--sinks";
    case EvictionField::kRecent:
      return "--h2o-recent";
    case EvictionField::kSnapKvWindow:
      return "--snapkv-window";
    case EvictionField::kSnapKvKernel:
      return "--snapkv-kernel";
    case EvictionField::kEvictingStep:
      return "--evict-step";
  }
  return "?";
}

bool eviction_policy_reads(EvictionPolicy policy, EvictionField field) {
  switch (field) {
    case EvictionField::kBudget:
    case EvictionField::kEvictingStep:
      return policy != EvictionPolicy::kNone;
    case EvictionField::kSinks:
      return policy == EvictionPolicy::kStreaming;
    case EvictionField::kRecent:
      return policy == EvictionPolicy::kH2o;
    case EvictionField::kSnapKvWindow:
    case EvictionField::kSnapKvKernel:
      return policy == EvictionPolicy::kSnapKv;
  }
  return false;
}

Status validate_eviction_fields_set(EvictionPolicy policy, std::span<const EvictionField> fields_set) {
  for (EvictionField field : fields_set) {
    if (eviction_policy_reads(policy, field)) continue;
    std::string readers;  // "streaming", "window, streaming, h2o or snapkv"
    std::vector<const char*> names;
    for (EvictionPolicy p : kAllPolicies) {
      if (eviction_policy_reads(p, field)) names.push_back(eviction_policy_name(p));
    }
    for (size_t i = 0; i < names.size(); ++i) {
      readers += i == 0 ? "" : i + 1 == names.size() ? " or " : ", ";
      readers += names[i];
    }
    const char* flag = eviction_field_flag(field);
    return Status::errorf("{} does nothing with --policy {}: drop {}, or choose --policy {} ({})", flag,
                          eviction_policy_name(policy), flag, readers,
                          names.size() == 1 ? "the only policy that reads it" : "the policies that read it");
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
