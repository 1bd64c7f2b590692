// Test helper: a copy of a GGUF file with its metadata edited, for tests of what loaders refuse.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "gguf/gguf_writer.h"

namespace kvlm::testing {

// Writes `dst`: every metadata key of `src` except `skip_key` (empty: none), then what `edit`
// sets (it may overwrite a key), and every tensor byte for byte. Returns dst.
std::string rewrite_gguf_metadata(const std::string& src, const std::string& dst,
                                  const std::function<void(GgufWriter&)>& edit, std::string_view skip_key = {});

}  // namespace kvlm::testing
