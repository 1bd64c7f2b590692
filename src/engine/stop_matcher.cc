#include "engine/stop_matcher.h"

#include <algorithm>
#include <utility>

namespace kvlm {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
  for (const std::string& s : stops_) longest_ = std::max(longest_, s.size());
}

std::string StopMatcher::push(std::string_view piece) {
  if (stopped_) return {};
  pending_.append(piece);
  if (stops_.empty()) return std::exchange(pending_, {});
  // The earliest stop string wins: text before it goes out, the rest never does.
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of a stop string.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    for (size_t len = std::min(s.size() - 1, pending_.size()); len > keep; --len) {
      if (std::string_view(pending_).substr(pending_.size() - len) == std::string_view(s).substr(0, len)) {
        keep = len;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - keep);
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string StopMatcher::finish() {
  if (stopped_) return {};
  return std::exchange(pending_, {});
}

}  // namespace kvlm
