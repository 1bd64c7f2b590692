#include "core/page_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

namespace kvlm {
namespace {

// An open read-only descriptor, closed on every path.
class ReadOnlyFd {
 public:
  explicit ReadOnlyFd(const std::string& path) : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)) {}
  ~ReadOnlyFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  ReadOnlyFd(const ReadOnlyFd&) = delete;
  ReadOnlyFd& operator=(const ReadOnlyFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

Result<uint64_t> regular_file_size(const std::string& path, int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Status::errorf("{}: cannot stat: {}", path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return Status::errorf("{}: is not a regular file", path);
  return static_cast<uint64_t>(st.st_size);
}

}  // namespace

Result<uint64_t> page_cache_resident_bytes(const std::string& path) {
  const ReadOnlyFd fd(path);
  if (fd.get() < 0) return Status::errorf("{}: cannot open: {}", path, std::strerror(errno));
  KVLM_ASSIGN_OR_RETURN(const uint64_t size, regular_file_size(path, fd.get()));
  if (size == 0) return uint64_t{0};
  // Mapping touches no page; mincore reports which ones the cache holds.
  void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (mapping == MAP_FAILED) return Status::errorf("{}: cannot map: {}", path, std::strerror(errno));
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident((size + page - 1) / page);
  const int rc = ::mincore(mapping, size, resident.data());
  const int err = errno;
  ::munmap(mapping, size);
  if (rc != 0) return Status::errorf("{}: mincore failed: {}", path, std::strerror(err));
  const uint64_t pages = static_cast<uint64_t>(std::count_if(resident.begin(), resident.end(),
                                                             [](unsigned char r) { return (r & 1) != 0; }));
  return std::min(size, pages * page);
}

Status drop_from_page_cache(const std::string& path) {
  const ReadOnlyFd fd(path);
  if (fd.get() < 0) return Status::errorf("{}: cannot open: {}", path, std::strerror(errno));
  KVLM_RETURN_IF_ERROR(regular_file_size(path, fd.get()).status());
  const int rc = ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
  if (rc != 0) return Status::errorf("{}: cannot drop from the page cache: {}", path, std::strerror(rc));
  return Status::ok_status();
}

}  // namespace kvlm
