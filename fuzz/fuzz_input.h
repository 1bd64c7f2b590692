// FuzzInput: typed values read off the front of a fuzzer's bytes (zeros once they run out).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace kvlm::fuzz {

// Targets that drive an API with a sequence of choices read them from here. Running out of bytes
// is not an error: every read then returns its smallest value, so a short input is a short run.
class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  size_t remaining() const { return size_ - pos_; }
  bool empty() const { return pos_ == size_; }

  uint8_t take_byte() { return empty() ? 0 : data_[pos_++]; }
  bool take_bool() { return (take_byte() & 1) != 0; }
  uint32_t take_u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = (v << 8) | take_byte();
    return v;
  }
  // Uniform enough over [lo, hi] (inclusive); lo when hi <= lo.
  int take_int(int lo, int hi) {
    if (hi <= lo) return lo;
    const uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo) + 1;
    const uint64_t raw = span <= 256 ? take_byte() : take_u32();
    return static_cast<int>(static_cast<int64_t>(lo) + static_cast<int64_t>(raw % span));
  }
  // In [lo, hi], in 256 steps.
  float take_float(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(take_byte()) / 255.0f; }
  // A run of up to max_len bytes whose length is the next byte.
  std::string take_string(size_t max_len) {
    const size_t n = std::min<size_t>({take_byte(), max_len, remaining()});
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }
  // Everything left.
  std::string_view take_rest() {
    std::string_view rest(reinterpret_cast<const char*>(data_ + pos_), remaining());
    pos_ = size_;
    return rest;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Splits text at the first occurrence of `separator`: {before, after}; {text, ""} without one.
// Targets that take two inputs (template text and messages) read them from one input this way,
// so the seeds stay readable and the fuzzer can mutate either side.
inline std::pair<std::string_view, std::string_view> split_at(std::string_view text, std::string_view separator) {
  const size_t at = text.find(separator);
  if (at == std::string_view::npos) return {text, {}};
  return {text.substr(0, at), text.substr(at + separator.size())};
}

}  // namespace kvlm::fuzz
