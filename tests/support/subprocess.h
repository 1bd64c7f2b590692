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

}  // namespace kvlm::testing
