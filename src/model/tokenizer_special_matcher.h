// SpecialTokenMatcher: finds special-token texts inside input text (leftmost, then longest).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/ids.h"

namespace kvlm {

// A byte trie over the texts of the tokens that "parse special" splits out of the input
// (e.g. "<|eot_id|>"). Scanning tries each position once and walks the trie from there,
// so the cost is about the text length times the match depth, however many tokens there are.
class SpecialTokenMatcher {
 public:
  struct Match {
    size_t begin = 0;
    size_t length = 0;  // 0: no match
    TokenId id = -1;
  };

  // Later additions of the same text replace earlier ones. Empty texts are ignored.
  void add(std::string_view text, TokenId id);
  bool empty() const { return num_tokens_ == 0; }

  // The leftmost match starting at or after `from`, longest among those starting there.
  Match find_next(std::string_view text, size_t from) const;

 private:
  struct Node {
    TokenId id = -1;  // the token whose text ends here, or -1
  };
  static uint64_t edge_key(int32_t node, uint8_t byte) { return (static_cast<uint64_t>(node) << 8) | byte; }

  std::vector<Node> nodes_{Node{}};                // node 0 is the root
  std::unordered_map<uint64_t, int32_t> edges_;    // (node, byte) -> child node
  std::array<bool, 256> is_first_byte_{};          // quick rejection of positions
  int num_tokens_ = 0;
};

}  // namespace kvlm
