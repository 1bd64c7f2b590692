#include "core/dtype.h"

#include <array>
#include <cctype>
#include <string>

namespace kvlm {
namespace {

struct TypeRow {
  uint32_t id;
  GgmlTypeTraits traits;
};

// Block layouts of the GGML types a GGUF file may hold; `supported` marks what kvlm computes with.
constexpr std::array<TypeRow, 20> kTypeRows = {{
    {0, {"f32", 1, 4, true}},
    {1, {"f16", 1, 2, true}},
    {2, {"q4_0", 32, 18, true}},
    {3, {"q4_1", 32, 20, false}},
    {6, {"q5_0", 32, 22, false}},
    {7, {"q5_1", 32, 24, false}},
    {8, {"q8_0", 32, 34, true}},
    {9, {"q8_1", 32, 36, false}},
    {10, {"q2_k", 256, 84, false}},
    {11, {"q3_k", 256, 110, false}},
    {12, {"q4_k", 256, 144, false}},
    {13, {"q5_k", 256, 176, false}},
    {14, {"q6_k", 256, 210, false}},
    {15, {"q8_k", 256, 292, false}},
    {24, {"i8", 1, 1, false}},
    {25, {"i16", 1, 2, false}},
    {26, {"i32", 1, 4, false}},
    {27, {"i64", 1, 8, false}},
    {28, {"f64", 1, 8, false}},
    {30, {"bf16", 1, 2, true}},
}};

}  // namespace

std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t raw_type) {
  for (const TypeRow& row : kTypeRows) {
    if (row.id == raw_type) return row.traits;
  }
  return std::nullopt;
}

GgmlTypeTraits ggml_type_traits(GgmlType type) {
  return ggml_type_traits(static_cast<uint32_t>(type)).value_or(GgmlTypeTraits{"unknown", 0, 0, false});
}

std::string_view ggml_type_name(GgmlType type) { return ggml_type_traits(type).name; }

std::optional<GgmlType> parse_ggml_type(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const TypeRow& row : kTypeRows) {
    if (row.traits.name == lower) return static_cast<GgmlType>(row.id);
  }
  return std::nullopt;
}

}  // namespace kvlm
