#include "gguf/gguf_parser.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace kvlm {
namespace {

constexpr uint32_t kMaxValueType = static_cast<uint32_t>(GgufType::kFloat64);
constexpr uint64_t kMaxInt64 = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
constexpr size_t kMaxNameInMessage = 96;
// Reserve no more than this up front: a count is only a claim until its entries have been read.
constexpr uint64_t kMaxReserve = 4096;

// Fewest bytes one value of this type occupies, so `count * this` bounds what a count can claim.
uint64_t min_value_bytes(GgufType type) {
  if (const uint64_t fixed = gguf_scalar_bytes(type); fixed > 0) return fixed;
  return type == GgufType::kArray ? 12 : 8;  // array: element type and count; string: the length alone
}

// "[begin, end)" in absolute file offsets, without overflowing when a claimed size is absurd.
std::string byte_range(uint64_t begin, uint64_t num_bytes) {
  if (num_bytes > std::numeric_limits<uint64_t>::max() - begin) {
    return fmt::format("[{}, {} + {})", begin, begin, num_bytes);
  }
  return fmt::format("[{}, {})", begin, begin + num_bytes);
}

}  // namespace

std::string printable_name(std::string_view name) {
  std::string out = "'";
  const size_t shown = std::min(name.size(), kMaxNameInMessage);
  for (size_t i = 0; i < shown; ++i) {
    const auto byte = static_cast<unsigned char>(name[i]);
    if (byte < 0x20 || byte == 0x7f || byte == '\'' || byte == '\\') {
      out += fmt::format("\\x{:02x}", byte);
    } else {
      out += name[i];
    }
  }
  if (shown < name.size()) out += fmt::format("...' ({} bytes)", name.size());
  else out += "'";
  return out;
}

Status GgufParser::parse(GgufFile& file) {
  GgufParser parser(file);
  Status status = parser.parse_all();
  if (!status.ok()) return status.with_context(file.name_);
  return status;
}

Status GgufParser::parse_all() {
  if (file_.size_ == 0) return Status::error("file is empty (0 bytes)");
  KVLM_RETURN_IF_ERROR(parse_header());
  KVLM_RETURN_IF_ERROR(parse_metadata());
  KVLM_RETURN_IF_ERROR(parse_tensor_infos());
  return locate_tensor_data();
}

Status GgufParser::parse_header() {
  const uint8_t* magic = nullptr;
  KVLM_RETURN_IF_ERROR(cursor_.read_bytes(4, &magic).with_context("header: magic"));
  if (std::memcmp(magic, "GGUF", 4) != 0) {
    return Status::errorf("header: magic: bytes {:02x} {:02x} {:02x} {:02x} are not 'GGUF' (47 47 55 46), not a GGUF file",
                          magic[0], magic[1], magic[2], magic[3]);
  }

  uint32_t version = 0;
  KVLM_RETURN_IF_ERROR(cursor_.read_u32(&version).with_context("header: version"));
  if (version == 1) {
    return Status::error(
        "header: version: GGUF version 1 is not supported (it uses 32-bit counts); re-convert the model to GGUF v3");
  }
  if (version != 2 && version != 3) {
    const uint32_t swapped = __builtin_bswap32(version);
    if (swapped >= 1 && swapped <= 3) {
      return Status::errorf("header: version: {:#010x} looks like a big-endian GGUF file (version {}), which kvlm does "
                            "not read",
                            version, swapped);
    }
    return Status::errorf("header: version: {} is not supported (kvlm reads GGUF versions 2 and 3)", version);
  }
  file_.version_ = version;

  KVLM_RETURN_IF_ERROR(cursor_.read_u64(&tensor_count_).with_context("header: tensor_count"));
  KVLM_RETURN_IF_ERROR(cursor_.read_u64(&kv_count_).with_context("header: metadata_kv_count"));
  const uint64_t left = cursor_.remaining();
  if (kv_count_ > left / kMinKeyValueBytes) {
    return Status::errorf("header: metadata_kv_count: {} key-value pairs cannot fit in the {} bytes left "
                          "(each takes at least {})",
                          kv_count_, left, kMinKeyValueBytes);
  }
  if (tensor_count_ > left / kMinTensorInfoBytes) {
    return Status::errorf("header: tensor_count: {} tensor infos cannot fit in the {} bytes left (each takes at least {})",
                          tensor_count_, left, kMinTensorInfoBytes);
  }
  if (kv_count_ * kMinKeyValueBytes + tensor_count_ * kMinTensorInfoBytes > left) {  // each term <= left: no overflow
    return Status::errorf("header: metadata_kv_count {} and tensor_count {} cannot both fit in the {} bytes left",
                          kv_count_, tensor_count_, left);
  }
  if (kv_count_ > kGgufLimits.max_metadata_kv) {
    return Status::errorf("header: metadata_kv_count: {} is over the limit of {} (GgufLimits::max_metadata_kv)",
                          kv_count_, kGgufLimits.max_metadata_kv);
  }
  if (tensor_count_ > kGgufLimits.max_tensors) {
    return Status::errorf("header: tensor_count: {} is over the limit of {} (GgufLimits::max_tensors)", tensor_count_,
                          kGgufLimits.max_tensors);
  }
  return Status();
}

Status GgufParser::check_size(const char* what, uint64_t size, uint64_t limit, const char* limit_name) {
  if (size <= limit) return Status();
  return Status::errorf("{} of {} bytes is over the limit of {} bytes (GgufLimits::{})", what, size, limit, limit_name);
}

Status GgufParser::count_values(uint64_t n) {
  if (n > kMaxMetadataValues - num_values_) {
    return Status::errorf("metadata would hold more than {} values in total (a limit against corrupt counts)",
                          kMaxMetadataValues);
  }
  num_values_ += n;
  return Status();
}

Status GgufParser::parse_metadata() {
  std::unordered_map<std::string, uint64_t> seen;  // key -> index of its first occurrence
  file_.metadata_.reserve(std::min(kv_count_, kMaxReserve));
  for (uint64_t i = 0; i < kv_count_; ++i) {
    GgufKeyValue kv;
    KVLM_RETURN_IF_ERROR(cursor_.read_string(&kv.key).with_context(fmt::format("metadata key #{}", i)));
    if (kv.key.empty()) return Status::errorf("metadata key #{}: the key is empty", i);
    KVLM_RETURN_IF_ERROR(check_size("the key", kv.key.size(), kGgufLimits.max_key_bytes, "max_key_bytes")
                             .with_context(fmt::format("metadata key #{}", i)));
    const std::string field = fmt::format("metadata key {}", printable_name(kv.key));
    if (auto [it, inserted] = seen.emplace(kv.key, i); !inserted) {
      return Status::errorf("{}: duplicate key (metadata keys #{} and #{})", field, it->second, i);
    }

    uint32_t raw_type = 0;
    KVLM_RETURN_IF_ERROR(cursor_.read_u32(&raw_type).with_context(field + ": value type"));
    if (raw_type > kMaxValueType) return Status::errorf("{}: unknown value type {}", field, raw_type);
    KVLM_RETURN_IF_ERROR(count_values(1).with_context(field));
    Status status = parse_value(static_cast<GgufType>(raw_type), 0, &kv.value);
    if (!status.ok()) return status.with_context(field);
    if (kv.key == "general.alignment") KVLM_RETURN_IF_ERROR(apply_alignment(kv.value).with_context(field));
    file_.metadata_.push_back(std::move(kv));
  }
  return Status();
}

Status GgufParser::apply_alignment(const GgufValue& value) {
  const std::optional<int64_t> alignment = value.is_integer() ? value.as_int() : std::nullopt;
  if (!alignment) {
    return Status::errorf("has type {}, expected an integer (uint32)", gguf_type_name(value.type()));
  }
  const int64_t a = *alignment;
  if (a <= 0 || (a & (a - 1)) != 0 || static_cast<uint64_t>(a) > kMaxAlignment) {
    return Status::errorf("alignment {} is not a power of two between 1 and {}", a, kMaxAlignment);
  }
  file_.alignment_ = static_cast<uint64_t>(a);
  return Status();
}

Status GgufParser::parse_value(GgufType type, int depth, GgufValue* out) {
  switch (type) {
    case GgufType::kUint8:
    case GgufType::kBool: {
      uint8_t v = 0;
      KVLM_RETURN_IF_ERROR(cursor_.read_u8(&v));
      if (type == GgufType::kBool && v > 1) return Status::errorf("bool value {} is neither 0 nor 1", v);
      *out = GgufValue::make_uint(type, v);
      return Status();
    }
    case GgufType::kInt8: {
      uint8_t v = 0;
      KVLM_RETURN_IF_ERROR(cursor_.read_u8(&v));
      *out = GgufValue::make_int(type, static_cast<int8_t>(v));
      return Status();
    }
    case GgufType::kUint16: {
      uint16_t v = 0;
      KVLM_RETURN_IF_ERROR(cursor_.read_u16(&v));
      *out = GgufValue::make_uint(type, v);
      return Status();
    }
    case GgufType::kInt16: {
      uint16_t v = 0;
      KVLM_RETURN_IF_ERROR(cursor_.read_u16(&v));
      *out = GgufValue::make_int(type, static_cast<int16_t>(v));
      return Status();
    }
    case GgufType::kUint32: {
      uint32_t v = 0;
      KVLM_RETURN_IF_ERROR(cursor_.read_u32(&v));
      *out = GgufValue::make_uint(type, v);
      return Status();
    }
    case GgufType::kInt32: {
      uint32_t v = 0;
      KVLM_RETURN_IF_ERROR(cursor_.read_u32(&v));
      *out = GgufValue::make_int(type, static_cast<int32_t>(v));
      return Status();
    }
    case GgufType::kUint64: {
      uint64_t v = 0;
      KVLM_RETURN_IF_ERROR(cursor_.read_u64(&v));
      *out = GgufValue::make_uint(type, v);
      return Status();
    }
    case GgufType::kInt64: {
      uint64_t v = 0;
      KVLM_RETURN_IF_ERROR(cursor_.read_u64(&v));
      *out = GgufValue::make_int(type, static_cast<int64_t>(v));
      return Status();
    }
    case GgufType::kFloat32: {
      float v = 0;
      KVLM_RETURN_IF_ERROR(cursor_.read_f32(&v));
      *out = GgufValue::make_float(type, v);
      return Status();
    }
    case GgufType::kFloat64: {
      double v = 0;
      KVLM_RETURN_IF_ERROR(cursor_.read_f64(&v));
      *out = GgufValue::make_float(type, v);
      return Status();
    }
    case GgufType::kString: {
      std::string s;
      KVLM_RETURN_IF_ERROR(cursor_.read_string(&s));
      KVLM_RETURN_IF_ERROR(check_size("a string", s.size(), kGgufLimits.max_string_bytes, "max_string_bytes"));
      *out = GgufValue::make_string(std::move(s));
      return Status();
    }
    case GgufType::kArray:
      return parse_array(depth, out);
  }
  return Status::errorf("unknown value type {}", static_cast<uint32_t>(type));
}

Status GgufParser::parse_array(int depth, GgufValue* out) {
  if (depth >= kMaxArrayDepth) return Status::errorf("arrays are nested more than {} levels deep", kMaxArrayDepth);
  uint32_t raw_type = 0;
  KVLM_RETURN_IF_ERROR(cursor_.read_u32(&raw_type).with_context("array element type"));
  if (raw_type > kMaxValueType) return Status::errorf("unknown array element type {}", raw_type);
  const auto element_type = static_cast<GgufType>(raw_type);
  uint64_t count = 0;
  KVLM_RETURN_IF_ERROR(cursor_.read_u64(&count).with_context("array count"));
  const uint64_t min_bytes = min_value_bytes(element_type);
  if (count > cursor_.remaining() / min_bytes) {
    return Status::errorf("array count {} of {} elements cannot fit in the {} bytes left (each takes at least {})",
                          count, gguf_type_name(element_type), cursor_.remaining(), min_bytes);
  }
  KVLM_RETURN_IF_ERROR(count_values(count));

  std::vector<GgufValue> elements;
  elements.reserve(count);  // bounded by the bytes left and by kMaxMetadataValues
  for (uint64_t i = 0; i < count; ++i) {
    GgufValue element;
    Status status = parse_value(element_type, depth + 1, &element);
    if (!status.ok()) return status.with_context(fmt::format("element {}", i));
    elements.push_back(std::move(element));
  }
  *out = GgufValue::make_array(element_type, std::move(elements));
  return Status();
}

Status GgufParser::parse_tensor_infos() {
  std::unordered_map<std::string, uint64_t> seen;  // name -> tensor index
  file_.tensors_.reserve(std::min(tensor_count_, kMaxReserve));
  for (uint64_t i = 0; i < tensor_count_; ++i) {
    GgufTensorInfo t;
    KVLM_RETURN_IF_ERROR(cursor_.read_string(&t.name).with_context(fmt::format("tensor {} name", i)));
    if (t.name.empty()) return Status::errorf("tensor {} name: the name is empty", i);
    KVLM_RETURN_IF_ERROR(check_size("the name", t.name.size(), kGgufLimits.max_key_bytes, "max_key_bytes")
                             .with_context(fmt::format("tensor {} name", i)));
    const std::string field = fmt::format("tensor {} {}", i, printable_name(t.name));
    if (auto [it, inserted] = seen.emplace(t.name, i); !inserted) {
      return Status::errorf("{}: duplicate tensor name (tensors {} and {})", field, it->second, i);
    }

    uint32_t num_dims = 0;
    KVLM_RETURN_IF_ERROR(cursor_.read_u32(&num_dims).with_context(field + " n_dims"));
    if (num_dims == 0 || num_dims > kMaxDims) {
      return Status::errorf("{} n_dims: {} is outside 1..{}", field, num_dims, kMaxDims);
    }
    t.dims.resize(num_dims);
    for (uint32_t d = 0; d < num_dims; ++d) {
      uint64_t dim = 0;
      KVLM_RETURN_IF_ERROR(cursor_.read_u64(&dim).with_context(fmt::format("{} dims[{}]", field, d)));
      // Empty tensors are rejected: no model needs one, and a 0 is far more often corruption.
      if (dim == 0) return Status::errorf("{} dims[{}]: 0 (every dimension must be at least 1)", field, d);
      if (dim > kMaxInt64) return Status::errorf("{} dims[{}]: {} does not fit in int64", field, d, dim);
      t.dims[d] = static_cast<int64_t>(dim);
    }

    uint32_t raw_type = 0;
    KVLM_RETURN_IF_ERROR(cursor_.read_u32(&raw_type).with_context(field + " type"));
    const std::optional<GgmlTypeTraits> traits = ggml_type_traits(raw_type);
    if (!traits) return Status::errorf("{} type: unknown ggml type {}", field, raw_type);
    t.type = static_cast<GgmlType>(raw_type);

    const uint64_t dim0 = static_cast<uint64_t>(t.dims[0]);
    if (dim0 % traits->block_size != 0) {
      return Status::errorf("{} dims[0]: {} is not a multiple of the {} block size {}", field, dim0, traits->name,
                            traits->block_size);
    }
    uint64_t num_elements = 1;
    uint64_t num_bytes = 0;
    bool bytes_overflow = __builtin_mul_overflow(dim0 / traits->block_size, uint64_t{traits->block_bytes}, &num_bytes);
    for (uint32_t d = 0; d < num_dims; ++d) {
      const auto dim = static_cast<uint64_t>(t.dims[d]);
      if (__builtin_mul_overflow(num_elements, dim, &num_elements) || num_elements > kMaxInt64) {
        return Status::errorf("{} dims: the element count of {} overflows 64 bits", field, fmt::join(t.dims, " x "));
      }
      if (d > 0) bytes_overflow = bytes_overflow || __builtin_mul_overflow(num_bytes, dim, &num_bytes);
    }
    if (bytes_overflow) {
      return Status::errorf("{} dims: the byte size of {} {} overflows 64 bits", field, fmt::join(t.dims, " x "),
                            traits->name);
    }
    t.num_bytes = num_bytes;

    KVLM_RETURN_IF_ERROR(cursor_.read_u64(&t.offset).with_context(field + " offset"));
    if (t.offset % file_.alignment_ != 0) {
      return Status::errorf("{} offset: {} is not a multiple of the alignment {}", field, t.offset, file_.alignment_);
    }
    file_.tensors_.push_back(std::move(t));
  }
  return Status();
}

Status GgufParser::locate_tensor_data() {
  const uint64_t infos_end = cursor_.offset();
  const uint64_t alignment = file_.alignment_;
  // infos_end <= file size and alignment <= 2^30, so rounding up cannot overflow.
  const uint64_t data_start = (infos_end + alignment - 1) / alignment * alignment;
  file_.data_offset_ = data_start;
  std::vector<GgufTensorInfo>& tensors = file_.tensors_;
  if (tensors.empty()) return Status();  // a vocab-only file may end right after its metadata

  const uint64_t size = file_.size_;
  if (data_start > size) {
    return Status::errorf("data section: starts at offset {} (tensor infos end at {}, aligned to {}) but the file has "
                          "only {} bytes",
                          data_start, infos_end, alignment, size);
  }
  const uint64_t data_size = size - data_start;
  for (size_t i = 0; i < tensors.size(); ++i) {
    GgufTensorInfo& t = tensors[i];
    const std::string field = fmt::format("tensor {} {}", i, printable_name(t.name));
    if (t.offset > data_size) {
      return Status::errorf("{} offset: {} points past the end of the file ({} bytes; the data section starts at {})",
                            field, t.offset, size, data_start);
    }
    if (t.num_bytes > data_size - t.offset) {
      return Status::errorf("{}: data {} extends past the end of the file ({} bytes)", field,
                            byte_range(data_start + t.offset, t.num_bytes), size);
    }
    t.data = file_.base_ + data_start + t.offset;
  }

  // Sorted by offset, any overlap shows up between neighbours (the previous one has the largest end so far).
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return tensors[a].offset < tensors[b].offset; });
  for (size_t k = 1; k < order.size(); ++k) {
    const GgufTensorInfo& prev = tensors[order[k - 1]];
    const GgufTensorInfo& cur = tensors[order[k]];
    if (cur.offset < prev.offset + prev.num_bytes) {
      return Status::errorf("tensor {} {}: data {} overlaps tensor {} {} at {}", order[k], printable_name(cur.name),
                            byte_range(data_start + cur.offset, cur.num_bytes), order[k - 1],
                            printable_name(prev.name), byte_range(data_start + prev.offset, prev.num_bytes));
    }
  }

  file_.tensor_index_.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) file_.tensor_index_.emplace(tensors[i].name, i);
  return Status();
}

}  // namespace kvlm
