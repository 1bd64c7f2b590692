#include "server/token_logprobs.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "model/tokenizer.h"

namespace kvlm::server {

TokenLogprobs token_logprobs(std::span<const float> logits, TokenId sampled, int num_top, const Tokenizer& tokenizer) {
  double max_logit = -INFINITY;
  for (float v : logits) max_logit = std::max(max_logit, static_cast<double>(v));
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - max_logit);
  const double log_z = max_logit + std::log(sum);

  auto entry = [&](TokenId id) {
    return TokenLogprob{id, tokenizer.token_to_piece(id), static_cast<double>(logits[id]) - log_z};
  };
  TokenLogprobs out;
  out.sampled = entry(sampled);
  const int k = std::min<int>(num_top, static_cast<int>(logits.size()));
  if (k > 0) {
    std::vector<TokenId> ids(logits.size());
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](TokenId a, TokenId b) {
      return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
    });
    for (int i = 0; i < k; ++i) out.top.push_back(entry(ids[i]));
  }
  return out;
}

}  // namespace kvlm::server
