// TokenLogprobs: the log-probability of a sampled token and its top alternatives, from the
// logits row it was sampled from (the model's distribution, before any sampling filter).
#pragma once

#include <span>
#include <string>
#include <vector>

#include "core/ids.h"

namespace kvlm {
class Tokenizer;
}

namespace kvlm::server {

struct TokenLogprob {
  TokenId token = -1;
  std::string piece;   // the token's bytes (may be part of a UTF-8 character)
  double logprob = 0;
};

struct TokenLogprobs {
  TokenLogprob sampled;
  std::vector<TokenLogprob> top;  // the `num_top` most likely tokens, most likely first
};

// log_softmax over `logits` ([vocab]) in double precision; ties in the top list go to the lower id.
TokenLogprobs token_logprobs(std::span<const float> logits, TokenId sampled, int num_top, const Tokenizer& tokenizer);

}  // namespace kvlm::server
