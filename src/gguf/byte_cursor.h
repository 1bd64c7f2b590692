// ByteCursor: a bounds-checked little-endian reader over bytes it does not own.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "core/status.h"

namespace kvlm {

// Every read checks the remaining bytes first and leaves the cursor where it was on failure.
// Errors carry only the problem ("truncated: ..."); the caller adds which field it was reading.
class ByteCursor {
 public:
  ByteCursor(const uint8_t* data, uint64_t size) : data_(data), size_(size) {}

  uint64_t offset() const { return pos_; }
  uint64_t size() const { return size_; }
  uint64_t remaining() const { return size_ - pos_; }

  Status read_u8(uint8_t* out) { return read_le(out); }
  Status read_u16(uint16_t* out) { return read_le(out); }
  Status read_u32(uint32_t* out) { return read_le(out); }
  Status read_u64(uint64_t* out) { return read_le(out); }

  Status read_f32(float* out) {
    uint32_t bits = 0;
    KVLM_RETURN_IF_ERROR(read_le(&bits));
    std::memcpy(out, &bits, sizeof bits);
    return Status();
  }
  Status read_f64(double* out) {
    uint64_t bits = 0;
    KVLM_RETURN_IF_ERROR(read_le(&bits));
    std::memcpy(out, &bits, sizeof bits);
    return Status();
  }

  // Points `out` at the next n bytes (no copy) and moves past them.
  Status read_bytes(uint64_t n, const uint8_t** out) {
    if (n > remaining()) return truncated(n);
    *out = data_ + pos_;
    pos_ += n;
    return Status();
  }

  // A GGUF string: uint64 length, then that many bytes (no terminating NUL).
  Status read_string(std::string* out) {
    const uint64_t start = pos_;
    uint64_t length = 0;
    KVLM_RETURN_IF_ERROR(read_le(&length));
    if (length > remaining()) {
      pos_ = start;
      return Status::errorf("string length {} at offset {} exceeds the {} bytes left in the file", length,
                            start, size_ - start - sizeof(uint64_t));
    }
    out->assign(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(length));
    pos_ += length;
    return Status();
  }

 private:
  // Decoded byte by byte so the result does not depend on the host's byte order or alignment.
  template <typename T>
  Status read_le(T* out) {
    static_assert(std::is_unsigned_v<T>);
    if (sizeof(T) > remaining()) return truncated(sizeof(T));
    T value = 0;
    for (size_t i = 0; i < sizeof(T); ++i) value |= static_cast<T>(static_cast<T>(data_[pos_ + i]) << (8 * i));
    *out = value;
    pos_ += sizeof(T);
    return Status();
  }

  Status truncated(uint64_t needed) const {
    return Status::errorf("truncated: needs {} bytes at offset {} but only {} remain (file size {})", needed, pos_,
                          remaining(), size_);
  }

  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

}  // namespace kvlm
