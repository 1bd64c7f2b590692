// KvType: how K or V values are encoded in the cache (names and parsing), and KvRole (K or V).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace kvlm {

// One value per codec (see kv_codec.h for each type's block layout). K and V may
// use different types.
enum class KvType {
  kF32,
  kF16,
  kBf16,
  kFp8,    // E4M3, one f16 scale per token per kv head
  kInt8,   // symmetric, one f16 scale per token per kv head
  kInt4,   // asymmetric, groups along head_dim (kv_group_size), f16 scale and min per group
  kKivi4,  // KIVI, 4 bits: K per channel over a block's tokens, V per token in groups
  kKivi2,  // KIVI, 2 bits
};

// Which of the two cached tensors a codec encodes. Only KIVI encodes them differently
// (keys per channel, values per token), so only KIVI's block sizes differ by role.
enum class KvRole {
  kKey,
  kValue,
};

// Parses "f32", "f16", "bf16", "fp8", "int8", "int4", "kivi4", "kivi2"
// (case-insensitive); nullopt for anything else.
std::optional<KvType> parse_kv_type(std::string_view name);
// The name parse_kv_type accepts.
std::string_view kv_type_name(KvType type);
// Every type this build supports, in declaration order (planners and reports iterate it).
std::span<const KvType> all_kv_types();
// "f32, f16, ...": the names for error messages and --help.
std::string kv_type_list();
// True for the KIVI types: their keys are encoded a whole block at a time, so
// KvStorage keeps a block in full precision until it is sealed (kv_storage.h).
bool is_kivi(KvType type);

}  // namespace kvlm
