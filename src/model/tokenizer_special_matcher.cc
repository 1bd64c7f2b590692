#include "model/tokenizer_special_matcher.h"

namespace kvlm {

void SpecialTokenMatcher::add(std::string_view text, TokenId id) {
  if (text.empty()) return;
  int32_t node = 0;
  for (const char c : text) {
    const uint64_t key = edge_key(node, static_cast<uint8_t>(c));
    auto it = edges_.find(key);
    if (it == edges_.end()) {
      const auto child = static_cast<int32_t>(nodes_.size());
      nodes_.push_back(Node{});
      it = edges_.emplace(key, child).first;
    }
    node = it->second;
  }
  if (nodes_[node].id < 0) ++num_tokens_;
  nodes_[node].id = id;
  is_first_byte_[static_cast<uint8_t>(text[0])] = true;
}

SpecialTokenMatcher::Match SpecialTokenMatcher::find_next(std::string_view text, size_t from) const {
  if (empty()) return Match{text.size(), 0, -1};
  for (size_t begin = from; begin < text.size(); ++begin) {
    if (!is_first_byte_[static_cast<uint8_t>(text[begin])]) continue;
    Match best{begin, 0, -1};
    int32_t node = 0;
    for (size_t pos = begin; pos < text.size(); ++pos) {
      const auto it = edges_.find(edge_key(node, static_cast<uint8_t>(text[pos])));
      if (it == edges_.end()) break;
      node = it->second;
      if (nodes_[node].id >= 0) best = Match{begin, pos + 1 - begin, nodes_[node].id};
    }
    if (best.length > 0) return best;
  }
  return Match{text.size(), 0, -1};
}

}  // namespace kvlm
