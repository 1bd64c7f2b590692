// Test helpers: RawGguf assembles GGUF bytes field by field (also malformed ones the writer refuses).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf_file.h"

namespace kvlm::testing {

class RawGguf {
 public:
  RawGguf& u8(uint8_t v) {
    bytes_.push_back(v);
    return *this;
  }
  RawGguf& u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) bytes_.push_back(static_cast<uint8_t>(v >> (8 * i)));
    return *this;
  }
  RawGguf& u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) bytes_.push_back(static_cast<uint8_t>(v >> (8 * i)));
    return *this;
  }
  RawGguf& str(std::string_view s) {
    u64(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
    return *this;
  }
  RawGguf& raw(std::string_view s) {
    bytes_.insert(bytes_.end(), s.begin(), s.end());
    return *this;
  }
  RawGguf& zeros(size_t n) {
    bytes_.resize(bytes_.size() + n, 0);
    return *this;
  }
  RawGguf& pad_to(size_t alignment) {
    while (bytes_.size() % alignment != 0) bytes_.push_back(0);
    return *this;
  }
  RawGguf& header(uint64_t tensor_count, uint64_t kv_count, uint32_t version = 3) {
    raw("GGUF");
    u32(version);
    u64(tensor_count);
    return u64(kv_count);
  }
  // A metadata key-value with a uint32 value (type 4).
  RawGguf& kv_u32(std::string_view key, uint32_t v) { return str(key).u32(4).u32(v); }
  RawGguf& kv_string(std::string_view key, std::string_view v) { return str(key).u32(8).str(v); }
  RawGguf& tensor_info(std::string_view name, const std::vector<uint64_t>& dims, uint32_t type, uint64_t offset) {
    str(name);
    u32(static_cast<uint32_t>(dims.size()));
    for (const uint64_t d : dims) u64(d);
    u32(type);
    return u64(offset);
  }

  size_t size() const { return bytes_.size(); }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

// The parse error for `bytes`, or "OK" when they parse.
inline std::string parse_error(std::vector<uint8_t> bytes, std::string name = "x.gguf") {
  auto file = GgufFile::from_bytes(std::move(bytes), std::move(name));
  return file.ok() ? std::string("OK") : file.status().message();
}

}  // namespace kvlm::testing
