// KvType: how K or V values are encoded in the cache (names and parsing).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace kvlm {

// One value per codec (see kv_codec.h). K and V may use different types.
enum class KvType {
  kF32,
  kF16,
};

// Parses "f32", "f16" (case-insensitive); nullopt for anything else.
std::optional<KvType> parse_kv_type(std::string_view name);
// "f32", "f16".
std::string_view kv_type_name(KvType type);
// Every type this build supports, in declaration order (planners and reports iterate it).
std::span<const KvType> all_kv_types();
// "f32, f16, ...": the names for error messages and --help.
std::string kv_type_list();

}  // namespace kvlm
