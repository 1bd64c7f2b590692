#include "plan/memory_size.h"

#include <cctype>
#include <cmath>
#include <string>

#include <fmt/format.h>

namespace kvlm {
namespace {

std::string lower(std::string_view s) {
  std::string out;
  for (char c : s) out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Multiplier of a unit suffix (already lower-case, without spaces); 0 when unknown.
double unit_scale(const std::string& unit) {
  struct Unit {
    const char* name;
    double scale;
  };
  static constexpr Unit kUnits[] = {
      {"", 1},          {"b", 1},           {"kb", 1e3},        {"mb", 1e6},          {"gb", 1e9},
      {"tb", 1e12},     {"kib", 1024.0},    {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0},
      {"k", 1024.0},    {"m", 1048576.0},   {"g", 1073741824.0}, {"t", 1099511627776.0},
  };
  for (const Unit& u : kUnits) {
    if (unit == u.name) return u.scale;
  }
  return 0;
}

}  // namespace

Result<uint64_t> parse_memory_size(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return Status::errorf("bad memory size '{}': {} (examples: 24GiB, 24GB, 512MiB, 1.5GiB, 1000000)", text, why);
  };
  size_t i = 0;
  while (i < text.size() && text[i] == ' ') ++i;
  const size_t number_begin = i;
  bool seen_dot = false, seen_digit = false;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      seen_digit = true;
    } else if (c == '.' && !seen_dot) {
      seen_dot = true;
    } else {
      break;
    }
  }
  if (!seen_digit) return bad(number_begin < text.size() && text[number_begin] == '-' ? "negative" : "no number");
  const std::string number(text.substr(number_begin, i - number_begin));
  std::string unit;
  for (; i < text.size(); ++i) {
    if (text[i] != ' ') unit += text[i];
  }
  unit = lower(unit);
  const double scale = unit_scale(unit);
  if (scale == 0) return bad(fmt::format("unknown unit '{}'", unit));
  const double value = std::stod(number) * scale;
  if (value >= 9223372036854775808.0) return bad("too large");
  if (scale == 1 && seen_dot) return bad("a byte count must be whole");
  return static_cast<uint64_t>(std::floor(value));
}

std::string format_bytes(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return fmt::format("{:.0f} B", bytes);
  int u = 0;
  while (bytes >= 1024 && u < 5) {
    bytes /= 1024;
    ++u;
  }
  return fmt::format("{:.2f} {}", bytes, kUnits[u]);
}

Result<uint64_t> weight_bytes_for(double num_params, GgmlType type) {
  const GgmlTypeTraits traits = ggml_type_traits(type);
  if (traits.block_size == 0 || traits.block_bytes == 0) {
    return Status::errorf("weight type {} has no known size per value", traits.name);
  }
  if (!(num_params >= 0)) return Status::errorf("parameter count {} must be >= 0", num_params);
  const double blocks = std::ceil(num_params / traits.block_size);
  return static_cast<uint64_t>(blocks * traits.block_bytes);
}

}  // namespace kvlm
