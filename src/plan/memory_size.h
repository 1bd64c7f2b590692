// Memory sizes: parsing "24GiB"/"512MB"/bytes, printing them with binary units, weight bytes per type.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/dtype.h"
#include "core/status.h"

namespace kvlm {

// Parses a memory size: a number with an optional unit, case-insensitive, an optional space
// between: B, KB/MB/GB/TB (powers of 1000), KiB/MiB/GiB/TiB (powers of 1024), K/M/G/T as the
// binary units. "1.5GiB" is allowed; a plain number is whole bytes. Empty, negative, unknown
// units, fractional byte counts and sizes of 2^63 bytes or more are errors naming the input.
Result<uint64_t> parse_memory_size(std::string_view text);

// "512 B", "1.5 KiB", "12.55 GiB": binary units, two decimals above bytes.
std::string format_bytes(double bytes);

// Bytes of `num_params` weights stored as `type`, with the type's GGML block size
// (q8_0: 34 bytes per 32 values, q4_0: 18 per 32), rounded up. An error for types
// without a known block size.
Result<uint64_t> weight_bytes_for(double num_params, GgmlType type);

}  // namespace kvlm
