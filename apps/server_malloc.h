// glibc malloc settings for a process that serves for weeks, which glibc reads only at start-up
// (GLIBC_TUNABLES), so `kvlm serve` re-executes itself once with them set.
//
// Measured in the soak (scripts/soak.sh, ~90 HTTP threads): the live heap stays flat at 7-9 MB
// while RSS climbs ~15% in five minutes and keeps climbing. The cause is glibc's per-thread
// caches (tcache: up to 7 chunks of each of 64 sizes per thread, never handed back while the
// thread lives; httplib's threads live for good) and its raising of the mmap threshold after
// the first large free, which puts every later zlib compressor (~270 KB per JSON reply) into an
// arena to fragment it. With the caches off, large blocks always mmapped and at most 4 arenas,
// RSS is flat after warm-up; small allocations take an uncontended arena lock instead, which
// the compute path (buffers reused step to step) does not notice.
#pragma once

#include <optional>
#include <string>

namespace kvlm::cli {

// The settings added to GLIBC_TUNABLES (each only where the user's GLIBC_TUNABLES names none).
inline constexpr const char* kServerMallocTunables[] = {
    "glibc.malloc.tcache_count=0", "glibc.malloc.mmap_threshold=65536", "glibc.malloc.arena_max=4"};

// Re-executes this process (same pid, same arguments) with kServerMallocTunables in
// GLIBC_TUNABLES, unless GLIBC_TUNABLES already sets glibc.malloc.tcache_count (the user's
// choice, or this process after its re-exec). Returns only when there is nothing to do
// (nullopt) or the re-exec failed: then a warning to print, and the process goes on as it is.
std::optional<std::string> reexec_with_server_malloc_settings();

}  // namespace kvlm::cli
