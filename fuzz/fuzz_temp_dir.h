// FuzzTempDir: one private scratch directory per process, for targets whose API takes paths.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

#include "core/check.h"

namespace kvlm::fuzz {

// Created on first use under $TMPDIR (or /tmp), removed at exit. Each input overwrites the same
// few files, so a long run does not fill the disk.
inline const std::filesystem::path& fuzz_temp_dir() {
  static const std::filesystem::path dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/kvlm_fuzz_XXXXXX";
    KVLM_CHECK(::mkdtemp(pattern.data()) != nullptr, "cannot create a temp dir from {}", pattern);
    static const std::filesystem::path created(pattern);
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(created, ignored);
    });
    return created;
  }();
  return dir;
}

// Writes `bytes` to `name` inside fuzz_temp_dir() and returns its path.
inline std::string write_temp_file(const std::string& name, std::string_view bytes) {
  const std::filesystem::path path = fuzz_temp_dir() / name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  KVLM_CHECK(f != nullptr, "cannot write {}", path.string());
  const size_t written = bytes.empty() ? 0 : std::fwrite(bytes.data(), 1, bytes.size(), f);
  KVLM_CHECK(std::fclose(f) == 0 && written == bytes.size(), "short write to {}", path.string());
  return path.string();
}

}  // namespace kvlm::fuzz
