// Where a local TCP port is listening, read from /proc/net/tcp and tcp6 (Linux), so a test can
// check the bind address itself rather than what the log says it is.
#pragma once

#include <string>
#include <vector>

namespace kvlm::testing {

// The local addresses ("127.0.0.1", "0.0.0.0", "::", "::1", or the hex form for others) of the
// sockets in state LISTEN on `port`; empty when none is found.
std::vector<std::string> listening_addresses(int port);

}  // namespace kvlm::testing
