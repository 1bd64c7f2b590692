// GgufParser: validates GGUF bytes and fills a GgufFile (internal to the gguf module).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"
#include "gguf/byte_cursor.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_limits.h"
#include "gguf/gguf_value.h"

namespace kvlm {

// Reads the header, metadata and tensor infos of file.base_[0, file.size_) and checks every
// count, size and offset against the bytes that remain before using or allocating for it.
// Tensor data is not read, only located: it must lie inside the file, aligned, without overlaps.
class GgufParser {
 public:
  // Limits that real files stay far below (see gguf/gguf_limits.h).
  static constexpr uint32_t kMaxDims = kGgufLimits.max_dims;
  static constexpr int kMaxArrayDepth = kGgufLimits.max_array_depth;
  static constexpr uint64_t kMaxMetadataValues = kGgufLimits.max_metadata_values;
  static constexpr uint64_t kMaxAlignment = kGgufLimits.max_alignment;
  // Smallest encodings, used to reject counts that cannot fit in the remaining bytes.
  static constexpr uint64_t kMinKeyValueBytes = 8 + 4 + 1;                // key length, type, 1-byte value
  static constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // name length, n_dims, 1 dim, type, offset

  // Fills `file` from its bytes; errors read "<file name>: <field>: <problem>".
  static Status parse(GgufFile& file);

 private:
  explicit GgufParser(GgufFile& file) : file_(file), cursor_(file.base_, file.size_) {}

  Status parse_all();
  Status parse_header();
  Status parse_metadata();
  Status parse_tensor_infos();
  Status locate_tensor_data();
  // Errors from these carry only the problem; callers add the field.
  Status parse_value(GgufType type, int depth, GgufValue* out);
  Status parse_array(int depth, GgufValue* out);
  Status count_values(uint64_t n);
  // `what` of `size` bytes against `limit` (named `limit_name` in the error).
  static Status check_size(const char* what, uint64_t size, uint64_t limit, const char* limit_name);
  Status apply_alignment(const GgufValue& value);

  GgufFile& file_;
  ByteCursor cursor_;
  uint64_t tensor_count_ = 0;
  uint64_t kv_count_ = 0;
  uint64_t num_values_ = 0;
};

// A name from the file made safe for an error message: quoted, control bytes escaped, long names cut.
std::string printable_name(std::string_view name);

}  // namespace kvlm
