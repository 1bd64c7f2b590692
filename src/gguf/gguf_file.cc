#include "gguf/gguf_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <system_error>

#include <fmt/format.h>

#include "gguf/gguf_parser.h"

namespace kvlm {
namespace {

constexpr size_t kPageBytes = 4096;

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

// "uint32", or "array of string" for arrays, as used in type-mismatch errors.
std::string describe_type(const GgufValue& value) {
  if (value.type() != GgufType::kArray) return std::string(gguf_type_name(value.type()));
  return fmt::format("array of {}", gguf_type_name(value.element_type()));
}

}  // namespace

int64_t GgufTensorInfo::num_elements() const {
  int64_t n = 1;
  for (const int64_t d : dims) n *= d;  // the parser (and writer) ensured this fits
  return n;
}

Result<std::unique_ptr<GgufFile>> GgufFile::open(const std::string& path) {
  // O_NONBLOCK keeps open() from waiting forever on a FIFO; it is refused below as not a regular file.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return Status::errorf("{}: cannot open: {}", path, errno_text(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::errorf("{}: cannot stat: {}", path, errno_text(err));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return Status::errorf("{}: is a directory, not a GGUF file", path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::errorf("{}: is not a regular file", path);
  }
  if (st.st_size == 0) {
    ::close(fd);
    return Status::errorf("{}: file is empty (0 bytes)", path);
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  // Read-only and private: the weights are shared with the page cache and never written back.
  void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (mapping == MAP_FAILED) return Status::errorf("{}: cannot map {} bytes: {}", path, size, errno_text(map_errno));

  std::unique_ptr<GgufFile> file(new GgufFile());
  file->name_ = path;
  file->mapping_ = mapping;
  file->base_ = static_cast<const uint8_t*>(mapping);
  file->size_ = size;
  KVLM_RETURN_IF_ERROR(GgufParser::parse(*file));
  return file;
}

Result<std::unique_ptr<GgufFile>> GgufFile::from_bytes(std::vector<uint8_t> bytes, std::string name) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->name_ = std::move(name);
  if (!bytes.empty()) {
    // Exactly bytes.size(), so AddressSanitizer still sees any read past the end.
    void* storage_ptr = nullptr;
    if (::posix_memalign(&storage_ptr, kPageBytes, bytes.size()) != 0) {
      return Status::errorf("{}: cannot allocate {} bytes", file->name_, bytes.size());
    }
    auto* storage = static_cast<uint8_t*>(storage_ptr);
    file->owned_bytes_.reset(storage);
    std::memcpy(storage, bytes.data(), bytes.size());
    file->base_ = storage;
  }
  file->size_ = bytes.size();
  KVLM_RETURN_IF_ERROR(GgufParser::parse(*file));
  return file;
}

void GgufFile::FreeDeleter::operator()(uint8_t* p) const { std::free(p); }

GgufFile::~GgufFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, size_);
}

const GgufValue* GgufFile::find(std::string_view key) const {
  for (const GgufKeyValue& kv : metadata_) {
    if (kv.key == key) return &kv.value;
  }
  return nullptr;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

Status missing_key(const std::string& file, std::string_view key) {
  return Status::errorf("{}: metadata key '{}' is missing", file, key);
}

Status wrong_type(const std::string& file, std::string_view key, const GgufValue& value, std::string_view expected) {
  return Status::errorf("{}: metadata key '{}' has type {}, expected {}", file, key, describe_type(value), expected);
}

bool is_float_type(GgufType t) { return t == GgufType::kFloat32 || t == GgufType::kFloat64; }

bool is_integer_type(GgufType t) {
  switch (t) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kUint16:
    case GgufType::kInt16:
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kUint64:
    case GgufType::kInt64:
      return true;
    default:
      return false;
  }
}

}  // namespace

Result<std::string> GgufFile::get_string(std::string_view key) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return missing_key(name_, key);
  const std::optional<std::string_view> s = value->as_string();
  if (!s) return wrong_type(name_, key, *value, "string");
  return std::string(*s);
}

Result<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return missing_key(name_, key);
  if (!value->is_integer()) return wrong_type(name_, key, *value, "an integer");
  const std::optional<int64_t> v = value->as_int();
  if (!v) return Status::errorf("{}: metadata key '{}' value {} does not fit in int64", name_, key,
                                value->to_display_string());
  return *v;
}

Result<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return missing_key(name_, key);
  const std::optional<double> v = value->as_float();
  if (!v) return wrong_type(name_, key, *value, "a float or integer");
  return *v;
}

Result<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return missing_key(name_, key);
  const std::optional<bool> v = value->as_bool();
  if (!v) return wrong_type(name_, key, *value, "bool");
  return *v;
}

Result<std::vector<std::string>> GgufFile::get_string_array(std::string_view key) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return missing_key(name_, key);
  if (value->type() != GgufType::kArray || value->element_type() != GgufType::kString) {
    return wrong_type(name_, key, *value, "array of string");
  }
  std::vector<std::string> out;
  out.reserve(value->elements().size());
  for (const GgufValue& e : value->elements()) out.emplace_back(*e.as_string());
  return out;
}

Result<std::vector<float>> GgufFile::get_float_array(std::string_view key) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return missing_key(name_, key);
  if (value->type() != GgufType::kArray ||
      !(is_float_type(value->element_type()) || is_integer_type(value->element_type()))) {
    return wrong_type(name_, key, *value, "array of float or integer");
  }
  std::vector<float> out;
  out.reserve(value->elements().size());
  for (const GgufValue& e : value->elements()) out.push_back(static_cast<float>(*e.as_float()));
  return out;
}

Result<std::vector<int64_t>> GgufFile::get_int_array(std::string_view key) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return missing_key(name_, key);
  if (value->type() != GgufType::kArray || !is_integer_type(value->element_type())) {
    return wrong_type(name_, key, *value, "array of integer");
  }
  std::vector<int64_t> out;
  out.reserve(value->elements().size());
  for (size_t i = 0; i < value->elements().size(); ++i) {
    const GgufValue& e = value->elements()[i];
    const std::optional<int64_t> v = e.as_int();
    if (!v) {
      return Status::errorf("{}: metadata key '{}' element {} value {} does not fit in int64", name_, key, i,
                            e.to_display_string());
    }
    out.push_back(*v);
  }
  return out;
}

}  // namespace kvlm
