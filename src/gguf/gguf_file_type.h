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
    case GgmlType::kQ4_1: return 3;
    case GgmlType::kQ8_0: return 7;
    case GgmlType::kQ5_0: return 8;
    case GgmlType::kQ5_1: return 9;
    case GgmlType::kQ2_K: return 10;
    case GgmlType::kQ3_K: return 12;  // "Q3_K_M": the name llama-quantize gives a mostly-Q3_K file
    case GgmlType::kQ4_K: return 15;  // Q4_K_M
    case GgmlType::kQ5_K: return 17;  // Q5_K_M
    case GgmlType::kQ6_K: return 18;
    case GgmlType::kIQ4_NL: return 25;
    case GgmlType::kIQ4_XS: return 30;
    case GgmlType::kBF16: return 32;
    default: return 0;
  }
}

}  // namespace kvlm
