// Reading a text file named on the command line (evaluation texts, filler).
#pragma once

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "cli_error.h"

namespace kvlm::cli {

// The file's bytes, or its first max_bytes when max_bytes > 0; a CliError naming the file otherwise.
inline std::string read_text_file(const std::string& path, size_t max_bytes = 0) {
  if (!std::filesystem::is_regular_file(path)) throw CliError(fmt::format("text file '{}' not found", path));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CliError(fmt::format("cannot read text file '{}'", path));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  if (max_bytes > 0 && text.size() > max_bytes) text.resize(max_bytes);
  return text;
}

}  // namespace kvlm::cli
