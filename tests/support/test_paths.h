// Where tests find the shared models and a scratch folder.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>
#include <cstdint>

namespace kvlm::testing {

// The shared models folder: $KVLM_SHARED/models, else ../shared/models beside the
// source tree; nullopt when it is absent (tests then GTEST_SKIP with a clear message).
std::optional<std::filesystem::path> shared_models_dir();

// Path of one shared model file, or nullopt when it is absent.
std::optional<std::filesystem::path> shared_file(const std::string& name);

// A file or folder of the independent reference tools: $KVLM_SHARED/anchors/<relative>, else
// ../shared/anchors/<relative> beside the source tree; nullopt when absent.
std::optional<std::filesystem::path> shared_anchor(const std::string& relative);

// A fresh, empty scratch folder under the build tree, private to the running test.
std::filesystem::path scratch_dir(const std::string& test_name);

// Whole-file helpers for tests that corrupt or compare files.
std::vector<uint8_t> read_bytes(const std::filesystem::path& path);
void write_bytes(const std::filesystem::path& path, const std::vector<uint8_t>& bytes);

}  // namespace kvlm::testing

// Skips the current test with a clear message when a shared file is absent.
#define KVLM_REQUIRE_SHARED(var, name)                                                   \
  auto var##_opt = ::kvlm::testing::shared_file(name);                                  \
  if (!var##_opt) GTEST_SKIP() << "shared model file " << (name)                        \
                               << " not found (set KVLM_SHARED or place ../shared)";    \
  const std::filesystem::path var = *var##_opt
