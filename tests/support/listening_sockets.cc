#include "support/listening_sockets.h"

#include <fstream>
#include <sstream>

namespace kvlm::testing {
namespace {

constexpr const char* kListenState = "0A";  // TCP_LISTEN in /proc/net/tcp's "st" column

std::string readable_address(const std::string& hex) {
  if (hex == "0100007F") return "127.0.0.1";
  if (hex == "00000000") return "0.0.0.0";
  if (hex == "00000000000000000000000000000000") return "::";
  if (hex == "00000000000000000000000001000000") return "::1";
  return hex;
}

void scan(const char* table, int port, std::vector<std::string>& out) {
  std::ifstream in(table);
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state;
    fields >> slot >> local >> remote >> state;
    const size_t colon = local.find(':');
    if (colon == std::string::npos || state != kListenState) continue;
    if (std::stoi(local.substr(colon + 1), nullptr, 16) != port) continue;
    out.push_back(readable_address(local.substr(0, colon)));
  }
}

}  // namespace

std::vector<std::string> listening_addresses(int port) {
  std::vector<std::string> out;
  scan("/proc/net/tcp", port, out);
  scan("/proc/net/tcp6", port, out);
  return out;
}

}  // namespace kvlm::testing
