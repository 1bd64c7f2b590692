// gguf_file_type: the general.file_type number GGUF writers record for a model's main weight type.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace kvlm {

// llama.cpp's llama_ftype numbering ("all f32", "mostly f16", ...); 0 for types without one.
inline uint32_t gguf_file_type(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: return 0;
    case GgmlType::kF16: return 1;
    case GgmlType::kQ4_0: return 2;
    case GgmlType::kQ8_0: return 7;
    case GgmlType::kBF16: return 32;
    default: return 0;
  }
}

}  // namespace kvlm
