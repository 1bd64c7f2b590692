// GgufWriter: builds a GGUF v3 file (synthetic models, converters, test fixtures).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "gguf/gguf_value.h"

namespace kvlm {

class GgufByteSink;  // where serialized bytes go: a file or a vector (gguf_writer.cc)

class GgufWriter {
 public:
  // Fills a tensor's bytes at write time, so multi-GB models never sit in memory whole.
  using TensorFiller = std::function<void(uint8_t* dst, uint64_t num_bytes)>;

  // Adds or replaces a metadata key (insertion order is kept).
  void set(const std::string& key, GgufValue value);
  void set_string(const std::string& key, std::string v) { set(key, GgufValue::make_string(std::move(v))); }
  void set_u32(const std::string& key, uint32_t v) { set(key, GgufValue::u32(v)); }
  void set_i32(const std::string& key, int32_t v) { set(key, GgufValue::i32(v)); }
  void set_f32(const std::string& key, float v) { set(key, GgufValue::f32(v)); }
  void set_bool(const std::string& key, bool v) { set(key, GgufValue::make_bool(v)); }

  // dims in GGUF order (dims[0] contiguous). Byte size follows from type and dims;
  // dims[0] must be a multiple of the type's block size. A shape no file can hold (a dim < 1,
  // more than 8 dims, a byte count that does not match, a duplicate name) is a bug: KVLM_CHECK aborts.
  void add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> dims, std::vector<uint8_t> bytes);
  void add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> dims, TensorFiller filler);
  // F32 data converted to `type` (f32, f16, bf16, q8_0, q4_0) with ops-free scalar quantizers.
  void add_tensor_f32(const std::string& name, GgmlType type, std::vector<int64_t> dims, const std::vector<float>& values);

  // Default 32; also written as general.alignment when not 32. Setting general.alignment
  // through set() changes the alignment too, so the two never disagree.
  void set_alignment(uint32_t alignment);

  Status write(const std::string& path) const;  // atomically: temp file, then rename
  std::vector<uint8_t> to_bytes() const;         // the same bytes, in memory (tests)

 private:
  struct PendingTensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> dims;
    uint64_t num_bytes;
    TensorFiller filler;
  };
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<PendingTensor> tensors_;
  uint32_t alignment_ = 32;

  // Header, metadata, tensor infos and the padding up to the data section.
  std::vector<uint8_t> encode_head() const;
  Status serialize(GgufByteSink& sink) const;
};

}  // namespace kvlm
