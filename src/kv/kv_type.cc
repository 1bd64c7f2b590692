#include "kv/kv_type.h"

#include <algorithm>
#include <cctype>
#include <string>

#include "core/check.h"

namespace kvlm {

std::optional<KvType> parse_kv_type(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower == "f32") return KvType::kF32;
  if (lower == "f16") return KvType::kF16;
  return std::nullopt;
}

std::string_view kv_type_name(KvType type) {
  switch (type) {
    case KvType::kF32:
      return "f32";
    case KvType::kF16:
      return "f16";
  }
  KVLM_CHECK(false, "unknown KvType {}", static_cast<int>(type));
  return {};
}

std::span<const KvType> all_kv_types() {
  static constexpr KvType kAll[] = {KvType::kF32, KvType::kF16};
  return kAll;
}

std::string kv_type_list() {
  std::string names;
  for (KvType type : all_kv_types()) {
    if (!names.empty()) names += ", ";
    names += kv_type_name(type);
  }
  return names;
}

}  // namespace kvlm
