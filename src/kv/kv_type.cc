#include "kv/kv_type.h"

#include <algorithm>
#include <cctype>
#include <string>

#include "core/check.h"

namespace kvlm {
namespace {

constexpr KvType kAll[] = {KvType::kF32,  KvType::kF16,  KvType::kBf16,  KvType::kFp8,
                           KvType::kInt8, KvType::kInt4, KvType::kKivi4, KvType::kKivi2};

}  // namespace

std::optional<KvType> parse_kv_type(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (KvType type : kAll) {
    if (lower == kv_type_name(type)) return type;
  }
  return std::nullopt;
}

std::string_view kv_type_name(KvType type) {
  switch (type) {
    case KvType::kF32:
      return "f32";
    case KvType::kF16:
      return "f16";
    case KvType::kBf16:
      return "bf16";
    case KvType::kFp8:
      return "fp8";
    case KvType::kInt8:
      return "int8";
    case KvType::kInt4:
      return "int4";
    case KvType::kKivi4:
      return "kivi4";
    case KvType::kKivi2:
      return "kivi2";
  }
  KVLM_CHECK(false, "unknown KvType {}", static_cast<int>(type));
  return {};
}

std::span<const KvType> all_kv_types() { return kAll; }

std::string kv_type_list() {
  std::string names;
  for (KvType type : all_kv_types()) {
    if (!names.empty()) names += ", ";
    names += kv_type_name(type);
  }
  return names;
}

bool is_kivi(KvType type) { return type == KvType::kKivi4 || type == KvType::kKivi2; }

}  // namespace kvlm
