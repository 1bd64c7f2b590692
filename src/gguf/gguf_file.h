// GgufFile: a validated, memory-mapped GGUF (v2/v3) file; tensors are zero-copy views.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "gguf/gguf_value.h"

namespace kvlm {

// One tensor's header plus a pointer to its bytes inside the mapping.
struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // GGUF order: dims[0] is the contiguous (innermost) dimension; 1..8 dims, each >= 1
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;        // from the start of the data section
  uint64_t num_bytes = 0;     // validated against type and dims
  const uint8_t* data = nullptr;

  int64_t num_elements() const;
};

struct GgufKeyValue {
  std::string key;
  GgufValue value;
};

class GgufFile {
 public:
  // Maps and validates the whole file. Every error names the file, the field and the problem.
  static Result<std::unique_ptr<GgufFile>> open(const std::string& path);
  // Same validation over bytes in memory (tests, fuzzing); `name` appears in errors. The bytes are
  // copied to page-aligned storage so tensor data has the file's alignment, as with open().
  static Result<std::unique_ptr<GgufFile>> from_bytes(std::vector<uint8_t> bytes, std::string name);

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& name() const { return name_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t file_size() const { return size_; }
  // File offset where the data section starts (tensor offsets are relative to it).
  uint64_t data_offset() const { return data_offset_; }

  const std::vector<GgufKeyValue>& metadata() const { return metadata_; }
  const GgufValue* find(std::string_view key) const;  // nullptr when absent

  // Typed getters. A missing key or a value of another type is an error naming the key.
  Result<std::string> get_string(std::string_view key) const;
  Result<int64_t> get_int(std::string_view key) const;  // any integer type (uint64 must fit int64)
  Result<double> get_float(std::string_view key) const; // float32/float64, or an integer
  Result<bool> get_bool(std::string_view key) const;
  Result<std::vector<std::string>> get_string_array(std::string_view key) const;
  Result<std::vector<float>> get_float_array(std::string_view key) const;   // float or integer elements
  Result<std::vector<int64_t>> get_int_array(std::string_view key) const;   // integer elements

  // The whole file where it lies in memory, and whether that is a mapping of the file on disk
  // (open) rather than a copy (from_bytes): a mapping reads the file as it is now, so a file
  // truncated under it faults (SIGBUS) past its new end.
  std::span<const uint8_t> bytes() const { return {base_, static_cast<size_t>(size_)}; }
  bool is_mapped() const { return mapping_ != nullptr; }

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;  // nullptr when absent

 private:
  GgufFile() = default;
  friend class GgufParser;

  std::string name_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  const uint8_t* base_ = nullptr;   // the mapping or owned_bytes_
  uint64_t size_ = 0;
  uint64_t data_offset_ = 0;
  void* mapping_ = nullptr;         // from mmap, unmapped in the destructor
  struct FreeDeleter {
    void operator()(uint8_t* p) const;
  };
  // from_bytes keeps a page-aligned copy, so tensor data is aligned in memory exactly as in a mapping.
  std::unique_ptr<uint8_t, FreeDeleter> owned_bytes_;
  std::vector<GgufKeyValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string_view, size_t> tensor_index_;  // views of tensors_[i].name
};

}  // namespace kvlm
