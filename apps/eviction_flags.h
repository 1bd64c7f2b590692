// --policy / --budget and the policies' options: the token eviction chosen on the command line.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli_error.h"
#include "evict/eviction_options.h"

namespace kvlm::cli {

struct EvictionFlags {
  std::string policy = "none";
  EvictionOptions options;
  // Each field's option, to tell a flag the user gave from a default (CLI::Option::count).
  std::vector<std::pair<EvictionField, const CLI::Option*>> field_options;

  void add_to(CLI::App* cmd) {
    cmd->add_option("--policy", policy, "token eviction: none, window, streaming, h2o or snapkv")
        ->capture_default_str();
    auto field = [&](EvictionField f, CLI::Option* option) { field_options.emplace_back(f, option); };
    field(EvictionField::kBudget,
          cmd->add_option("--budget", options.budget, "most tokens attention sees under --policy (every layer)"));
    field(EvictionField::kSinks,
          cmd->add_option("--sinks", options.sinks, "streaming: first tokens always kept (attention sinks)")
              ->capture_default_str());
    field(EvictionField::kRecent,
          cmd->add_option("--h2o-recent", options.recent, "h2o: newest tokens always kept (default budget / 2)"));
    field(EvictionField::kSnapKvWindow,
          cmd->add_option("--snapkv-window", options.snapkv_window,
                          "snapkv: last prompt tokens whose attention picks the prompt tokens kept")
              ->capture_default_str());
    field(EvictionField::kSnapKvKernel,
          cmd->add_option("--snapkv-kernel", options.snapkv_kernel, "snapkv: max-pooling width over positions (odd)")
              ->capture_default_str());
    field(EvictionField::kEvictingStep,
          cmd->add_option("--evict-step", options.evicting_step,
                          "tokens per forward once the budget is full (1 = token by token, as the papers)")
              ->capture_default_str());
  }

  // The validated options; CliError naming the flag otherwise, also for a flag the policy would
  // ignore (--sinks under h2o, --budget without a policy).
  EvictionOptions eviction() const {
    EvictionOptions o = options;
    o.policy = value_or_throw(parse_eviction_policy(policy));
    std::vector<EvictionField> fields_set;
    for (const auto& [f, option] : field_options) {
      if (option->count() > 0) fields_set.push_back(f);
    }
    throw_if_error(validate_eviction_fields_set(o.policy, fields_set));
    throw_if_error(validate_eviction_options(o));
    return o;
  }
};

}  // namespace kvlm::cli
