// GgufValue: one metadata value of a GGUF file (scalar, string or typed array).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvlm {

// Metadata value types, numbered as GGUF stores them.
enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

std::string_view gguf_type_name(GgufType type);

// Bytes one value of a fixed-size type occupies in the file; 0 for strings and arrays,
// whose size depends on their contents.
inline uint64_t gguf_scalar_bytes(GgufType type) {
  switch (type) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
      return 8;
    case GgufType::kString:
    case GgufType::kArray:
      return 0;
  }
  return 0;
}

// A value keeps the exact stored type so a writer can reproduce it. Integers are held
// in a uint64_t/int64_t wide enough for every integer type; arrays hold elements of one type.
class GgufValue {
 public:
  GgufValue() = default;
  static GgufValue make_uint(GgufType type, uint64_t v);     // kUint8..kUint64, kBool
  static GgufValue make_int(GgufType type, int64_t v);       // kInt8..kInt64
  static GgufValue make_float(GgufType type, double v);      // kFloat32, kFloat64
  static GgufValue make_bool(bool v);
  static GgufValue make_string(std::string v);
  static GgufValue make_array(GgufType element_type, std::vector<GgufValue> elements);
  // Convenience constructors used by the writer.
  static GgufValue u32(uint32_t v) { return make_uint(GgufType::kUint32, v); }
  static GgufValue i32(int32_t v) { return make_int(GgufType::kInt32, v); }
  static GgufValue f32(float v) { return make_float(GgufType::kFloat32, v); }
  static GgufValue string_array(const std::vector<std::string>& v);
  static GgufValue f32_array(const std::vector<float>& v);
  static GgufValue i32_array(const std::vector<int32_t>& v);

  GgufType type() const { return type_; }
  GgufType element_type() const { return element_type_; }  // for arrays
  const std::vector<GgufValue>& elements() const { return elements_; }

  bool is_integer() const;
  std::optional<int64_t> as_int() const;   // integer types and bool; nullopt if not representable
  std::optional<uint64_t> as_uint() const; // integer types and bool; nullopt if negative
  std::optional<double> as_float() const;  // float types and integers
  std::optional<bool> as_bool() const;
  std::optional<std::string_view> as_string() const;

  std::string to_display_string(size_t max_elements = 8) const;  // for `kvlm inspect`

 private:
  GgufType type_ = GgufType::kUint8;
  GgufType element_type_ = GgufType::kUint8;
  uint64_t u_ = 0;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  std::vector<GgufValue> elements_;
};

}  // namespace kvlm
