// How much of a file the kernel's page cache holds, and dropping it: a model "loads" by mapping
// its file, so whether the bytes are already in memory decides how long the first token takes.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace kvlm {

// Bytes of `path` resident in the page cache now (whole pages, capped at the file's size).
Result<uint64_t> page_cache_resident_bytes(const std::string& path);

// Asks the kernel to drop the file's clean cached pages (posix_fadvise DONTNEED: no privileges
// needed), so the next read comes from the disk: a cold start without dropping every cache.
// Pages another process has mapped may stay; page_cache_resident_bytes says what remained.
Status drop_from_page_cache(const std::string& path);

}  // namespace kvlm
