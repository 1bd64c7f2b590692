#include "support/test_paths.h"

#include <cstdlib>
#include <fstream>
#include <iterator>

#include <gtest/gtest.h>

namespace kvlm::testing {

std::optional<std::filesystem::path> shared_models_dir() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("KVLM_SHARED"); env != nullptr && *env != '\0') {
    const fs::path dir = fs::path(env) / "models";
    if (fs::is_directory(dir)) return dir;
  }
  const fs::path beside = fs::path(KVLM_SOURCE_DIR) / ".." / "shared" / "models";
  if (fs::is_directory(beside)) return fs::canonical(beside);
  return std::nullopt;
}

std::optional<std::filesystem::path> shared_file(const std::string& name) {
  auto dir = shared_models_dir();
  if (!dir) return std::nullopt;
  const std::filesystem::path p = *dir / name;
  if (!std::filesystem::exists(p)) return std::nullopt;
  return p;
}

std::optional<std::filesystem::path> shared_anchor(const std::string& relative) {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("KVLM_SHARED"); env != nullptr && *env != '\0') {
    const fs::path p = fs::path(env) / "anchors" / relative;
    if (fs::exists(p)) return p;
  }
  const fs::path beside = fs::path(KVLM_SOURCE_DIR) / ".." / "shared" / "anchors" / relative;
  if (fs::exists(beside)) return fs::canonical(beside);
  return std::nullopt;
}

std::filesystem::path scratch_dir(const std::string& test_name) {
  namespace fs = std::filesystem;
  // ctest runs tests in parallel processes: the running test's full name keeps their folders apart.
  std::string owner = "no_test";
  if (const auto* info = ::testing::UnitTest::GetInstance()->current_test_info()) {
    owner = std::string(info->test_suite_name()) + "." + info->name();
    for (char& c : owner) {
      if (c == '/') c = '_';
    }
  }
  const fs::path dir = fs::path(KVLM_BINARY_DIR) / "test_scratch" / owner / test_name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::vector<uint8_t> read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace kvlm::testing
