#include "gguf/gguf_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>
#include <system_error>

#include <fmt/format.h>

#include "core/check.h"
#include "core/quantize.h"

namespace kvlm {

// Receives the serialized file in order; write() fails only for I/O errors.
class GgufByteSink {
 public:
  virtual ~GgufByteSink() = default;
  virtual Status write(const uint8_t* data, uint64_t n) = 0;
};

namespace {

constexpr uint32_t kGgufVersion = 3;
constexpr uint32_t kDefaultAlignment = 32;
constexpr const char* kAlignmentKey = "general.alignment";
constexpr uint32_t kMaxDims = 8;

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

uint64_t align_up(uint64_t n, uint64_t alignment) { return (n + alignment - 1) / alignment * alignment; }

bool is_power_of_two(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

class VectorSink : public GgufByteSink {
 public:
  explicit VectorSink(std::vector<uint8_t>* out) : out_(out) {}
  Status write(const uint8_t* data, uint64_t n) override {
    out_->insert(out_->end(), data, data + n);
    return Status();
  }

 private:
  std::vector<uint8_t>* out_;
};

// Buffers small writes (the padding) and passes large ones (tensor data) straight through.
class FileSink : public GgufByteSink {
 public:
  explicit FileSink(int fd) : fd_(fd) { buffer_.reserve(kBufferBytes); }

  Status write(const uint8_t* data, uint64_t n) override {
    if (buffer_.size() + n > kBufferBytes) {
      KVLM_RETURN_IF_ERROR(flush());
      if (n >= kBufferBytes) return write_all(data, n);
    }
    buffer_.insert(buffer_.end(), data, data + n);
    return Status();
  }

  Status flush() {
    Status status = write_all(buffer_.data(), buffer_.size());
    buffer_.clear();
    return status;
  }

 private:
  static constexpr size_t kBufferBytes = 1 << 20;

  Status write_all(const uint8_t* data, uint64_t n) {
    while (n > 0) {
      const ssize_t written = ::write(fd_, data, std::min<uint64_t>(n, 1u << 30));
      if (written < 0) {
        if (errno == EINTR) continue;
        return Status::errorf("write failed: {}", errno_text(errno));
      }
      data += written;
      n -= static_cast<uint64_t>(written);
    }
    return Status();
  }

  int fd_;
  std::vector<uint8_t> buffer_;
};

// Little-endian encoders for the head of the file.
void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

void put_u64(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

void put_uint(std::vector<uint8_t>& out, uint64_t v, int num_bytes) {
  for (int i = 0; i < num_bytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

void put_string(std::vector<uint8_t>& out, std::string_view s) {
  put_u64(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

// The value without its type tag (arrays carry their element type and count).
void put_value(std::vector<uint8_t>& out, const GgufValue& value) {
  switch (value.type()) {
    case GgufType::kUint8:
    case GgufType::kBool:
    case GgufType::kUint16:
    case GgufType::kUint32:
    case GgufType::kUint64:
      put_uint(out, *value.as_uint(), static_cast<int>(gguf_scalar_bytes(value.type())));
      return;
    case GgufType::kInt8:
    case GgufType::kInt16:
    case GgufType::kInt32:
    case GgufType::kInt64:
      // Two's complement: the low bytes of the 64-bit pattern are the narrower encoding.
      put_uint(out, static_cast<uint64_t>(*value.as_int()), static_cast<int>(gguf_scalar_bytes(value.type())));
      return;
    case GgufType::kFloat32: {
      const float f = static_cast<float>(*value.as_float());
      uint32_t bits;
      std::memcpy(&bits, &f, sizeof bits);
      put_u32(out, bits);
      return;
    }
    case GgufType::kFloat64: {
      const double d = *value.as_float();
      uint64_t bits;
      std::memcpy(&bits, &d, sizeof bits);
      put_u64(out, bits);
      return;
    }
    case GgufType::kString:
      put_string(out, *value.as_string());
      return;
    case GgufType::kArray:
      put_u32(out, static_cast<uint32_t>(value.element_type()));
      put_u64(out, value.elements().size());
      for (const GgufValue& e : value.elements()) put_value(out, e);
      return;
  }
  KVLM_CHECK(false, "unknown value type {}", static_cast<uint32_t>(value.type()));
}

// Bytes of a tensor of `type` and `dims`; aborts on shapes no file could hold (writer input is code, not data).
uint64_t tensor_bytes(const std::string& name, GgmlType type, const std::vector<int64_t>& dims) {
  const GgmlTypeTraits traits = ggml_type_traits(type);
  KVLM_CHECK(traits.block_size > 0, "tensor '{}': unknown ggml type {}", name, static_cast<uint32_t>(type));
  KVLM_CHECK(!dims.empty() && dims.size() <= kMaxDims, "tensor '{}': {} dims (must be 1..{})", name, dims.size(),
             kMaxDims);
  for (size_t d = 0; d < dims.size(); ++d) KVLM_CHECK(dims[d] >= 1, "tensor '{}': dims[{}] = {}", name, d, dims[d]);
  KVLM_CHECK(dims[0] % traits.block_size == 0, "tensor '{}': dims[0] = {} is not a multiple of the {} block size {}",
             name, dims[0], traits.name, traits.block_size);
  uint64_t num_elements = 1;
  uint64_t num_bytes = static_cast<uint64_t>(dims[0] / traits.block_size) * traits.block_bytes;
  bool overflow = false;
  for (size_t d = 0; d < dims.size(); ++d) {
    overflow = overflow || __builtin_mul_overflow(num_elements, static_cast<uint64_t>(dims[d]), &num_elements);
    if (d > 0) overflow = overflow || __builtin_mul_overflow(num_bytes, static_cast<uint64_t>(dims[d]), &num_bytes);
  }
  KVLM_CHECK(!overflow && num_elements <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
             "tensor '{}': size overflows", name);
  return num_bytes;
}

}  // namespace

void GgufWriter::set(const std::string& key, GgufValue value) {
  KVLM_CHECK(!key.empty(), "empty metadata key");
  if (key == kAlignmentKey) {
    const std::optional<int64_t> a = value.is_integer() ? value.as_int() : std::nullopt;
    KVLM_CHECK(a && *a <= std::numeric_limits<uint32_t>::max() && is_power_of_two(static_cast<uint64_t>(*a)),
               "{} must be a power of two that fits uint32, got {}", kAlignmentKey, value.to_display_string());
    alignment_ = static_cast<uint32_t>(*a);
  }
  for (auto& [existing_key, existing_value] : metadata_) {
    if (existing_key == key) {
      existing_value = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(key, std::move(value));
}

void GgufWriter::set_alignment(uint32_t alignment) {
  KVLM_CHECK(is_power_of_two(alignment), "alignment {} is not a power of two", alignment);
  alignment_ = alignment;
  bool present = false;
  for (const auto& kv : metadata_) present = present || kv.first == kAlignmentKey;
  if (alignment != kDefaultAlignment || present) set(kAlignmentKey, GgufValue::u32(alignment));
}

void GgufWriter::add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> dims, TensorFiller filler) {
  KVLM_CHECK(!name.empty(), "empty tensor name");
  for (const PendingTensor& t : tensors_) KVLM_CHECK(t.name != name, "tensor '{}' added twice", name);
  KVLM_CHECK(filler != nullptr, "tensor '{}' has no filler", name);
  const uint64_t num_bytes = tensor_bytes(name, type, dims);
  tensors_.push_back(PendingTensor{name, type, std::move(dims), num_bytes, std::move(filler)});
}

void GgufWriter::add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> dims,
                            std::vector<uint8_t> bytes) {
  const uint64_t num_bytes = tensor_bytes(name, type, dims);
  KVLM_CHECK(bytes.size() == num_bytes, "tensor '{}': {} bytes given, its type and dims need {}", name, bytes.size(),
             num_bytes);
  // shared_ptr because std::function must be copyable.
  auto data = std::make_shared<const std::vector<uint8_t>>(std::move(bytes));
  add_tensor(name, type, std::move(dims), [data](uint8_t* dst, uint64_t n) {
    KVLM_CHECK(n == data->size(), "filler asked for {} bytes, holds {}", n, data->size());
    std::memcpy(dst, data->data(), n);
  });
}

void GgufWriter::add_tensor_f32(const std::string& name, GgmlType type, std::vector<int64_t> dims,
                                const std::vector<float>& values) {
  const uint64_t num_bytes = tensor_bytes(name, type, dims);
  uint64_t num_elements = 1;
  for (const int64_t d : dims) num_elements *= static_cast<uint64_t>(d);
  KVLM_CHECK(values.size() == num_elements, "tensor '{}': {} values given, dims hold {}", name, values.size(),
             num_elements);
  // Converted now rather than at write time: quantized bytes are smaller than the floats.
  const int64_t row_length = dims[0];
  const uint64_t row_bytes = ggml_row_bytes(type, row_length);
  const uint64_t num_rows = num_elements / static_cast<uint64_t>(row_length);
  std::vector<uint8_t> bytes(num_bytes);
  for (uint64_t r = 0; r < num_rows; ++r) {
    quantize_row_reference(type, values.data() + r * row_length, bytes.data() + r * row_bytes, row_length);
  }
  add_tensor(name, type, std::move(dims), std::move(bytes));
}

std::vector<uint8_t> GgufWriter::encode_head() const {
  std::vector<uint8_t> out;
  out.insert(out.end(), {'G', 'G', 'U', 'F'});
  put_u32(out, kGgufVersion);
  put_u64(out, tensors_.size());
  put_u64(out, metadata_.size());
  for (const auto& [key, value] : metadata_) {
    put_string(out, key);
    put_u32(out, static_cast<uint32_t>(value.type()));
    put_value(out, value);
  }
  uint64_t offset = 0;  // from the start of the data section
  for (const PendingTensor& t : tensors_) {
    offset = align_up(offset, alignment_);
    put_string(out, t.name);
    put_u32(out, static_cast<uint32_t>(t.dims.size()));
    for (const int64_t d : t.dims) put_u64(out, static_cast<uint64_t>(d));
    put_u32(out, static_cast<uint32_t>(t.type));
    put_u64(out, offset);
    offset += t.num_bytes;
  }
  out.resize(align_up(out.size(), alignment_), 0);
  return out;
}

Status GgufWriter::serialize(GgufByteSink& sink) const {
  const std::vector<uint8_t> head = encode_head();
  KVLM_RETURN_IF_ERROR(sink.write(head.data(), head.size()));
  const std::vector<uint8_t> zeros(alignment_, 0);
  std::vector<uint8_t> buffer;  // one tensor at a time
  for (const PendingTensor& t : tensors_) {
    buffer.assign(t.num_bytes, 0);
    t.filler(buffer.data(), t.num_bytes);
    KVLM_RETURN_IF_ERROR(sink.write(buffer.data(), buffer.size()));
    // Every tensor, the last one included, is padded to the alignment (as llama.cpp writes files).
    const uint64_t padding = align_up(t.num_bytes, alignment_) - t.num_bytes;
    KVLM_RETURN_IF_ERROR(sink.write(zeros.data(), padding));
  }
  return Status();
}

std::vector<uint8_t> GgufWriter::to_bytes() const {
  std::vector<uint8_t> out;
  VectorSink sink(&out);
  const Status status = serialize(sink);
  KVLM_CHECK(status.ok(), "writing to memory failed: {}", status.message());
  return out;
}

Status GgufWriter::write(const std::string& path) const {
  static std::atomic<uint64_t> counter{0};
  const std::string temp_path = fmt::format("{}.tmp.{}.{}", path, ::getpid(), counter.fetch_add(1));
  const int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return Status::errorf("writing {}: cannot create {}: {}", path, temp_path, errno_text(errno));

  FileSink sink(fd);
  Status status = serialize(sink);
  if (status.ok()) status = sink.flush();
  if (status.ok() && ::fsync(fd) != 0) status = Status::errorf("fsync failed: {}", errno_text(errno));
  if (::close(fd) != 0 && status.ok()) status = Status::errorf("close failed: {}", errno_text(errno));
  if (status.ok() && ::rename(temp_path.c_str(), path.c_str()) != 0) {
    status = Status::errorf("cannot rename {} to it: {}", temp_path, errno_text(errno));
  }
  if (!status.ok()) {
    ::unlink(temp_path.c_str());
    return status.with_context(fmt::format("writing {}", path));
  }
  return Status();
}

}  // namespace kvlm
