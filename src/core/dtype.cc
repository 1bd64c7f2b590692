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

// Block layouts of every GGML type a GGUF file may hold; `supported` marks what kvlm computes
// with. Sizes of the i-quants, ternary and fp4 types are GGML's public block sizes; Q1_0, Q2_0
// and NVFP4 were read off files the anchor llama-quantize writes (bytes per tensor over rows
// whose widths it accepts or refuses).
constexpr std::array<TypeRow, 41> kTypeRows = {{
    {0, {"f32", 1, 4, true}},
    {1, {"f16", 1, 2, true}},
    {2, {"q4_0", 32, 18, true}},
    {3, {"q4_1", 32, 20, true}},
    {6, {"q5_0", 32, 22, true}},
    {7, {"q5_1", 32, 24, true}},
    {8, {"q8_0", 32, 34, true}},
    {9, {"q8_1", 32, 36, false}},
    {10, {"q2_k", 256, 84, true}},
    {11, {"q3_k", 256, 110, true}},
    {12, {"q4_k", 256, 144, true}},
    {13, {"q5_k", 256, 176, true}},
    {14, {"q6_k", 256, 210, true}},
    {15, {"q8_k", 256, 292, false}},
    {16, {"iq2_xxs", 256, 66, false}},
    {17, {"iq2_xs", 256, 74, false}},
    {18, {"iq3_xxs", 256, 98, false}},
    {19, {"iq1_s", 256, 50, false}},
    {20, {"iq4_nl", 32, 18, true}},
    {21, {"iq3_s", 256, 110, false}},
    {22, {"iq2_s", 256, 82, false}},
    {23, {"iq4_xs", 256, 136, true}},
    {24, {"i8", 1, 1, false}},
    {25, {"i16", 1, 2, false}},
    {26, {"i32", 1, 4, false}},
    {27, {"i64", 1, 8, false}},
    {28, {"f64", 1, 8, false}},
    {29, {"iq1_m", 256, 56, false}},
    {30, {"bf16", 1, 2, true}},
    {31, {"q4_0_4_4", 32, 18, false}},
    {32, {"q4_0_4_8", 32, 18, false}},
    {33, {"q4_0_8_8", 32, 18, false}},
    {34, {"tq1_0", 256, 54, false}},
    {35, {"tq2_0", 256, 66, false}},
    {36, {"iq4_nl_4_4", 32, 18, false}},
    {37, {"iq4_nl_4_8", 32, 18, false}},
    {38, {"iq4_nl_8_8", 32, 18, false}},
    {39, {"mxfp4", 32, 17, false}},
    {40, {"nvfp4", 64, 36, false}},
    {41, {"q1_0", 128, 18, false}},
    {42, {"q2_0", 64, 18, false}},
}};

std::string make_supported_names() {
  std::string out;
  for (const TypeRow& row : kTypeRows) {
    if (!row.traits.supported) continue;
    if (!out.empty()) out += ", ";
    out += row.traits.name;
  }
  return out;
}

}  // namespace

std::string_view supported_ggml_type_names() {
  static const std::string names = make_supported_names();
  return names;
}

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
