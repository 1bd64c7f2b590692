// Runs a command line and captures its exit code, stdout and stderr (for CLI tests).
#pragma once

#include <string>

namespace kvlm::testing {

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs `command` through /bin/sh; stdout and stderr are captured separately.
CommandResult run_command(const std::string& command);

// The kvlm binary of this build.
std::string kvlm_binary();

// `kvlm synth -o <scratch_dir(test)>/model.gguf <flags>`; returns the file's path (a gtest failure
// with synth's stderr when it did not succeed).
std::string synthesize_model(const std::string& test, const std::string& flags);

}  // namespace kvlm::testing
