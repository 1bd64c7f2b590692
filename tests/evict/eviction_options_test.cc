// Which policy reads which EvictionOptions field, and the error for a field set that it ignores.
#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "evict/eviction_options.h"

namespace kvlm {
namespace {

constexpr EvictionField kAllFields[] = {EvictionField::kBudget,       EvictionField::kSinks,
                                        EvictionField::kRecent,       EvictionField::kSnapKvWindow,
                                        EvictionField::kSnapKvKernel, EvictionField::kEvictingStep};

TEST(EvictionFields, EachPolicyReadsItsOwnFieldsAndTheBudget) {
  struct Reads {
    EvictionPolicy policy;
    std::vector<EvictionField> fields;
  };
  const Reads table[] = {
      {EvictionPolicy::kNone, {}},
      {EvictionPolicy::kWindow, {EvictionField::kBudget, EvictionField::kEvictingStep}},
      {EvictionPolicy::kStreaming, {EvictionField::kBudget, EvictionField::kSinks, EvictionField::kEvictingStep}},
      {EvictionPolicy::kH2o, {EvictionField::kBudget, EvictionField::kRecent, EvictionField::kEvictingStep}},
      {EvictionPolicy::kSnapKv,
       {EvictionField::kBudget, EvictionField::kSnapKvWindow, EvictionField::kSnapKvKernel,
        EvictionField::kEvictingStep}},
  };
  for (const Reads& r : table) {
    for (EvictionField f : kAllFields) {
      const bool listed = std::find(r.fields.begin(), r.fields.end(), f) != r.fields.end();
      EXPECT_EQ(eviction_policy_reads(r.policy, f), listed)
          << eviction_policy_name(r.policy) << " " << eviction_field_flag(f);
    }
    // What a policy reads may always be set.
    EXPECT_TRUE(validate_eviction_fields_set(r.policy, r.fields).ok()) << eviction_policy_name(r.policy);
  }
}

TEST(EvictionFields, AFieldThePolicyIgnoresNamesTheFlagThePolicyAndTheReaders) {
  const std::vector<EvictionField> sinks = {EvictionField::kBudget, EvictionField::kSinks};
  EXPECT_EQ(validate_eviction_fields_set(EvictionPolicy::kH2o, sinks).message(),
            "--sinks does nothing with --policy h2o: drop --sinks, or choose --policy streaming (the only policy "
            "that reads it)");
  const std::vector<EvictionField> budget = {EvictionField::kBudget};
  EXPECT_EQ(validate_eviction_fields_set(EvictionPolicy::kNone, budget).message(),
            "--budget does nothing with --policy none: drop --budget, or choose --policy window, streaming, h2o or "
            "snapkv (the policies that read it)");
  const std::vector<EvictionField> kernel = {EvictionField::kSnapKvKernel};
  EXPECT_EQ(validate_eviction_fields_set(EvictionPolicy::kWindow, kernel).message(),
            "--snapkv-kernel does nothing with --policy window: drop --snapkv-kernel, or choose --policy snapkv (the "
            "only policy that reads it)");
  const std::vector<EvictionField> recent = {EvictionField::kRecent};
  EXPECT_NE(validate_eviction_fields_set(EvictionPolicy::kSnapKv, recent).message().find("--h2o-recent"),
            std::string::npos);
  const std::vector<EvictionField> step = {EvictionField::kEvictingStep};
  EXPECT_NE(validate_eviction_fields_set(EvictionPolicy::kNone, step).message().find("--evict-step"),
            std::string::npos);
  EXPECT_TRUE(validate_eviction_fields_set(EvictionPolicy::kNone, {}).ok());
}

}  // namespace
}  // namespace kvlm
