// Where a command's model comes from: a GGUF file named on the command line, or the default
// compiled into the binary (stories260K, assets/stories260K/), so kvlm works from any folder.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "model/llama_model.h"

namespace kvlm::cli {

// What commands print for the embedded model where they print a file's path.
inline constexpr const char* kEmbeddedModelName = "stories260K (embedded)";

// The embedded GGUF file, exactly as it is in assets/stories260K/ (32-byte aligned, read-only).
std::span<const uint8_t> embedded_model_bytes();
inline size_t embedded_model_size() { return embedded_model_bytes().size(); }

// LlamaModel::load(path) with the file's mapping guarded (mapped_file_guard.h: a file truncated
// while kvlm runs ends it with a clear message, not "Bus error"). Errors are thrown as CliError.
std::unique_ptr<LlamaModel> load_model_file(const std::string& path);

// An empty path loads the embedded model; any other is LlamaModel::load(path). Errors are
// thrown as CliError naming the path.
std::unique_ptr<LlamaModel> load_model_or_embedded(const std::string& path);

// The path, or kEmbeddedModelName when it is empty: what reports and stats name the model by.
inline std::string model_display_name(const std::string& path) { return path.empty() ? kEmbeddedModelName : path; }

}  // namespace kvlm::cli
