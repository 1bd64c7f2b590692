#include "gguf/gguf_value.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "core/check.h"

namespace kvlm {
namespace {

bool is_unsigned_type(GgufType t) {
  return t == GgufType::kUint8 || t == GgufType::kUint16 || t == GgufType::kUint32 || t == GgufType::kUint64;
}

bool is_signed_type(GgufType t) {
  return t == GgufType::kInt8 || t == GgufType::kInt16 || t == GgufType::kInt32 || t == GgufType::kInt64;
}

uint64_t unsigned_max(GgufType t) {
  switch (t) {
    case GgufType::kBool: return 1;
    case GgufType::kUint8: return std::numeric_limits<uint8_t>::max();
    case GgufType::kUint16: return std::numeric_limits<uint16_t>::max();
    case GgufType::kUint32: return std::numeric_limits<uint32_t>::max();
    default: return std::numeric_limits<uint64_t>::max();
  }
}

int64_t signed_min(GgufType t) {
  switch (t) {
    case GgufType::kInt8: return std::numeric_limits<int8_t>::min();
    case GgufType::kInt16: return std::numeric_limits<int16_t>::min();
    case GgufType::kInt32: return std::numeric_limits<int32_t>::min();
    default: return std::numeric_limits<int64_t>::min();
  }
}

int64_t signed_max(GgufType t) {
  switch (t) {
    case GgufType::kInt8: return std::numeric_limits<int8_t>::max();
    case GgufType::kInt16: return std::numeric_limits<int16_t>::max();
    case GgufType::kInt32: return std::numeric_limits<int32_t>::max();
    default: return std::numeric_limits<int64_t>::max();
  }
}

// Strings inside arrays are quoted; control bytes are escaped so one value stays on one line.
std::string quoted(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    const auto byte = static_cast<unsigned char>(c);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (byte < 0x20 || byte == 0x7f) {
          out += fmt::format("\\x{:02x}", byte);
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

}  // namespace

std::string_view gguf_type_name(GgufType type) {
  switch (type) {
    case GgufType::kUint8: return "uint8";
    case GgufType::kInt8: return "int8";
    case GgufType::kUint16: return "uint16";
    case GgufType::kInt16: return "int16";
    case GgufType::kUint32: return "uint32";
    case GgufType::kInt32: return "int32";
    case GgufType::kFloat32: return "float32";
    case GgufType::kBool: return "bool";
    case GgufType::kString: return "string";
    case GgufType::kArray: return "array";
    case GgufType::kUint64: return "uint64";
    case GgufType::kInt64: return "int64";
    case GgufType::kFloat64: return "float64";
  }
  return "unknown";
}

GgufValue GgufValue::make_uint(GgufType type, uint64_t v) {
  KVLM_CHECK(is_unsigned_type(type) || type == GgufType::kBool, "make_uint with type {}", gguf_type_name(type));
  KVLM_CHECK(v <= unsigned_max(type), "value {} does not fit {}", v, gguf_type_name(type));
  GgufValue value;
  value.type_ = type;
  value.u_ = v;
  return value;
}

GgufValue GgufValue::make_int(GgufType type, int64_t v) {
  KVLM_CHECK(is_signed_type(type), "make_int with type {}", gguf_type_name(type));
  KVLM_CHECK(v >= signed_min(type) && v <= signed_max(type), "value {} does not fit {}", v, gguf_type_name(type));
  GgufValue value;
  value.type_ = type;
  value.i_ = v;
  return value;
}

GgufValue GgufValue::make_float(GgufType type, double v) {
  KVLM_CHECK(type == GgufType::kFloat32 || type == GgufType::kFloat64, "make_float with type {}",
             gguf_type_name(type));
  GgufValue value;
  value.type_ = type;
  // A float32 value holds exactly what the file stores, so reading back compares equal.
  value.f_ = type == GgufType::kFloat32 ? static_cast<double>(static_cast<float>(v)) : v;
  return value;
}

GgufValue GgufValue::make_bool(bool v) { return make_uint(GgufType::kBool, v ? 1 : 0); }

GgufValue GgufValue::make_string(std::string v) {
  GgufValue value;
  value.type_ = GgufType::kString;
  value.s_ = std::move(v);
  return value;
}

GgufValue GgufValue::make_array(GgufType element_type, std::vector<GgufValue> elements) {
  for (size_t i = 0; i < elements.size(); ++i) {
    KVLM_CHECK(elements[i].type() == element_type, "array of {} has element {} of type {}",
               gguf_type_name(element_type), i, gguf_type_name(elements[i].type()));
  }
  GgufValue value;
  value.type_ = GgufType::kArray;
  value.element_type_ = element_type;
  value.elements_ = std::move(elements);
  return value;
}

GgufValue GgufValue::string_array(const std::vector<std::string>& v) {
  std::vector<GgufValue> elements;
  elements.reserve(v.size());
  for (const std::string& s : v) elements.push_back(make_string(s));
  return make_array(GgufType::kString, std::move(elements));
}

GgufValue GgufValue::f32_array(const std::vector<float>& v) {
  std::vector<GgufValue> elements;
  elements.reserve(v.size());
  for (const float f : v) elements.push_back(f32(f));
  return make_array(GgufType::kFloat32, std::move(elements));
}

GgufValue GgufValue::i32_array(const std::vector<int32_t>& v) {
  std::vector<GgufValue> elements;
  elements.reserve(v.size());
  for (const int32_t i : v) elements.push_back(i32(i));
  return make_array(GgufType::kInt32, std::move(elements));
}

bool GgufValue::is_integer() const { return is_unsigned_type(type_) || is_signed_type(type_); }

std::optional<int64_t> GgufValue::as_int() const {
  if (is_unsigned_type(type_) || type_ == GgufType::kBool) {
    if (u_ > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u_);
  }
  if (is_signed_type(type_)) return i_;
  return std::nullopt;
}

std::optional<uint64_t> GgufValue::as_uint() const {
  if (is_unsigned_type(type_) || type_ == GgufType::kBool) return u_;
  if (is_signed_type(type_) && i_ >= 0) return static_cast<uint64_t>(i_);
  return std::nullopt;
}

std::optional<double> GgufValue::as_float() const {
  if (type_ == GgufType::kFloat32 || type_ == GgufType::kFloat64) return f_;
  if (is_unsigned_type(type_)) return static_cast<double>(u_);
  if (is_signed_type(type_)) return static_cast<double>(i_);
  return std::nullopt;
}

std::optional<bool> GgufValue::as_bool() const {
  if (type_ != GgufType::kBool) return std::nullopt;
  return u_ != 0;
}

std::optional<std::string_view> GgufValue::as_string() const {
  if (type_ != GgufType::kString) return std::nullopt;
  return std::string_view(s_);
}

std::string GgufValue::to_display_string(size_t max_elements) const {
  switch (type_) {
    case GgufType::kBool:
      return u_ != 0 ? "true" : "false";
    case GgufType::kFloat32:
      return fmt::format("{}", static_cast<float>(f_));  // shortest text that reads back as the same float
    case GgufType::kFloat64:
      return fmt::format("{}", f_);
    case GgufType::kString:
      return s_;
    case GgufType::kArray: {
      std::string out = "[";
      const size_t shown = std::min(max_elements, elements_.size());
      for (size_t i = 0; i < shown; ++i) {
        if (i > 0) out += ", ";
        const GgufValue& e = elements_[i];
        out += e.type_ == GgufType::kString ? quoted(e.s_) : e.to_display_string(max_elements);
      }
      if (shown < elements_.size()) out += fmt::format("{}... ({} total)", shown > 0 ? ", " : "", elements_.size());
      out += "]";
      return out;
    }
    default:
      if (is_signed_type(type_)) return fmt::format("{}", i_);
      return fmt::format("{}", u_);
  }
}

}  // namespace kvlm
