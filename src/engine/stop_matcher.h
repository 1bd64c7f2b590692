// StopMatcher: finds stop strings in streamed text, holding back what may be the start of one.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kvlm {

// Text arrives in pieces; a stop string may span pieces. push() returns the text that is safe
// to emit: everything except a tail that is a proper prefix of some stop string. Once a stop
// string appears, stopped() is true and nothing from it on is ever emitted. Work per push is
// O(piece + longest stop string) per stop string.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  std::string push(std::string_view piece);
  // The held-back tail, at the end of the stream (no stop string can complete any more).
  std::string finish();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  size_t longest_ = 0;
  std::string pending_;  // held back: a suffix that might begin a stop string
  bool stopped_ = false;
};

}  // namespace kvlm
