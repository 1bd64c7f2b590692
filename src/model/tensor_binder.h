// TensorBinder: binds a GGUF file's tensors as weight views, collecting every problem
// (missing, wrong dims, unsupported type) so that one error lists them all. Internal to model/.
#pragma once

#include <algorithm>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/ranges.h>

#include "core/quantize.h"
#include "gguf/gguf_file.h"
#include "ops/matmul.h"

namespace kvlm {

// Collects problems across all tensors so one error lists everything missing or wrong.
class TensorBinder {
 public:
  explicit TensorBinder(const GgufFile& file) : file_(file) {}

  const GgufTensorInfo* find(const std::string& name, std::vector<int64_t> expected_dims) {
    const GgufTensorInfo* t = file_.find_tensor(name);
    if (t == nullptr) {
      missing_.push_back(name);
      return nullptr;
    }
    if (t->dims != expected_dims) {
      problems_.push_back(fmt::format("'{}' has dims [{}], expected [{}]", name, fmt::join(t->dims, ", "),
                                      fmt::join(expected_dims, ", ")));
      return nullptr;
    }
    if (!ggml_type_traits(t->type).supported) {
      unsupported_[ggml_type_name(t->type)].push_back(name);
      return nullptr;
    }
    return t;
  }

  WeightMatrix matrix(const std::string& name, int64_t rows, int64_t cols) {
    const GgufTensorInfo* t = find(name, {cols, rows});
    if (t == nullptr) return {};
    return WeightMatrix{t->type, t->data, rows, cols, ggml_row_bytes(t->type, cols)};
  }

  // Consecutive row ranges of one [sum of rows, cols] tensor, as views (phi3's fused tensors).
  std::vector<WeightMatrix> split_rows(const std::string& name, std::initializer_list<int64_t> rows, int64_t cols) {
    int64_t total = 0;
    for (int64_t r : rows) total += r;
    const WeightMatrix whole = matrix(name, total, cols);
    std::vector<WeightMatrix> parts;
    int64_t first = 0;
    for (int64_t r : rows) {
      if (whole.data == nullptr) {
        parts.push_back({});
        continue;
      }
      parts.push_back(WeightMatrix{whole.type, whole.data + first * whole.row_bytes, r, cols, whole.row_bytes});
      first += r;
    }
    return parts;
  }

  // A 3-D tensor {cols, rows, count} as `count` matrices of [rows, cols] (the experts of a MoE
  // layer, MLA's per-head k_b and v_b); empty views when it cannot be bound.
  std::vector<WeightMatrix> slabs(const std::string& name, int64_t count, int64_t rows, int64_t cols) {
    std::vector<WeightMatrix> out(static_cast<size_t>(count));
    const GgufTensorInfo* t = find(name, {cols, rows, count});
    if (t == nullptr) return out;
    const uint64_t row_bytes = ggml_row_bytes(t->type, cols);
    for (int64_t i = 0; i < count; ++i) {
      out[static_cast<size_t>(i)] = WeightMatrix{t->type, t->data + static_cast<uint64_t>(i * rows) * row_bytes, rows, cols,
                                                 row_bytes};
    }
    return out;
  }

  std::vector<float> vector(const std::string& name, int64_t n) {
    const GgufTensorInfo* t = find(name, {n});
    if (t == nullptr) return {};
    std::vector<float> out(static_cast<size_t>(n));
    dequantize_row_reference(t->type, t->data, out.data(), n);
    return out;
  }

  Status status() const {
    if (missing_.empty() && problems_.empty() && unsupported_.empty()) return Status::ok_status();
    std::string msg = fmt::format("{}: cannot load the model:", file_.name());
    if (!missing_.empty()) msg += fmt::format(" missing tensors: {}.", fmt::join(missing_, ", "));
    if (!problems_.empty()) msg += fmt::format(" {}.", fmt::join(problems_, "; "));
    // One clause per type, naming a few tensors: a file of one unsupported type has hundreds.
    for (const auto& [type, tensors] : unsupported_) {
      constexpr size_t kNamed = 3;
      const std::vector<std::string> named(tensors.begin(), tensors.begin() + std::min(kNamed, tensors.size()));
      msg += fmt::format(" weight type {} is not supported by kvlm ({} tensor{}: {}{}).", type, tensors.size(),
                         tensors.size() == 1 ? "" : "s", fmt::join(named, ", "), tensors.size() > kNamed ? ", ..." : "");
    }
    if (!unsupported_.empty()) msg += fmt::format(" kvlm computes with: {}.", supported_ggml_type_names());
    return Status::error(msg);
  }

 private:
  const GgufFile& file_;
  std::vector<std::string> missing_;
  std::vector<std::string> problems_;
  std::map<std::string_view, std::vector<std::string>> unsupported_;  // type name -> tensors
};

}  // namespace kvlm
