// GgufLimits: the bounds the GGUF reader puts on a file's counts and sizes.
#pragma once

#include <cstdint>

namespace kvlm {

// Real model files stay far below every bound; they exist so that a corrupt or hostile file
// is refused with an error naming the field and the limit, before it can make the reader
// allocate, recurse or loop without end. They are not configurable: a file that needs more is
// not a model kvlm can run. README.md's "Limits" table lists them.
struct GgufLimits {
  uint64_t max_metadata_kv = 1ull << 16;     // metadata key-value pairs (real files: under 100)
  uint64_t max_tensors = 1ull << 20;         // tensor infos (a 671B MoE has ~100k)
  uint64_t max_key_bytes = 1ull << 16;       // a metadata key or a tensor name (the spec: 65535)
  uint64_t max_string_bytes = 64ull << 20;   // one string value (chat templates: tens of KB)
  // All values and array elements together. Real vocabularies need under 1M (a 256k vocab with
  // scores and types is ~770k); 4M bounds what a hostile file can make us allocate (~370 MB).
  uint64_t max_metadata_values = 1ull << 22;
  int max_array_depth = 8;                   // levels of arrays inside arrays
  uint32_t max_dims = 8;                     // dimensions of one tensor
  uint64_t max_alignment = 1ull << 30;       // general.alignment
};

inline constexpr GgufLimits kGgufLimits{};

}  // namespace kvlm
