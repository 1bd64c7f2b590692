// Scalar reference conversions between F32 and the GGML weight types kvlm supports (layouts in
// core/quant_blocks.h).
// Used by writers (synth, convert) and as the oracle for the SIMD kernels in ops/.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace kvlm {

// n must be a multiple of the type's block size. Every type ggml_type_traits marks supported,
// plus q8_k (the K-quants' activation type). Quantizers search scales for least squared error.
void quantize_row_reference(GgmlType type, const float* src, uint8_t* dst, int64_t n);
void dequantize_row_reference(GgmlType type, const uint8_t* src, float* dst, int64_t n);
// Bytes of one row of n elements.
uint64_t ggml_row_bytes(GgmlType type, int64_t n);

}  // namespace kvlm
