// --mla: how a deepseek2 model computes attention (absorbed, the default, or expanded per head).
#pragma once

#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli_error.h"
#include "model/llama_model.h"
#include "model/mla_expanded.h"

namespace kvlm::cli {

struct MlaFlag {
  std::string mode = "absorbed";

  void add_to(CLI::App* cmd) {
    cmd->add_option("--mla", mode,
                    "MLA models: absorbed (queries through W_UK, the latent read once) or expanded (every head's K/V "
                    "from the latents, every step, as the model is written)")
        ->capture_default_str();
  }

  // Checks the flag against the loaded model and sets its mode; model_path names it in errors.
  void apply(LlamaModel& model, const std::string& model_path) const {
    if (mode != "absorbed" && mode != "expanded") {
      throw CliError(fmt::format("--mla '{}' is not one of: absorbed, expanded", mode));
    }
    if (mode == "expanded") {
      if (!model.config().is_mla()) throw CliError(fmt::format("--mla expanded: {} is not an MLA model", model_path));
      model.set_mla_mode(MlaMode::kExpanded);
    }
  }
};

}  // namespace kvlm::cli
