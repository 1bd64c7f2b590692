#include "support/subprocess.h"

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "support/test_paths.h"

namespace kvlm::testing {

CommandResult run_command(const std::string& command) {
  static int counter = 0;
  const auto dir = std::filesystem::path(KVLM_BINARY_DIR) / "test_scratch" / "subprocess";
  std::filesystem::create_directories(dir);
  const std::string err_path = (dir / ("stderr_" + std::to_string(::getpid()) + "_" + std::to_string(counter++))).string();
  CommandResult result;
  FILE* pipe = ::popen((command + " 2>" + err_path).c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) result.out.append(buffer, n);
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream err(err_path);
  std::stringstream ss;
  ss << err.rdbuf();
  result.err = ss.str();
  std::filesystem::remove(err_path);
  return result;
}

std::string kvlm_binary() { return std::string(KVLM_BINARY_DIR) + "/kvlm"; }

std::string synthesize_model(const std::string& test, const std::string& flags) {
  const std::string model = (scratch_dir(test) / "model.gguf").string();
  const CommandResult r = run_command(kvlm_binary() + " synth -o " + model + " " + flags);
  EXPECT_EQ(r.exit_code, 0) << "kvlm synth " << flags << ": " << r.err;
  return model;
}

}  // namespace kvlm::testing
