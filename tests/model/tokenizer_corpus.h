// A deterministic corpus of strings that stress tokenizers (spaces, digits, contractions, scripts, emoji...).
#pragma once

#include <string>
#include <vector>

namespace kvlm::testing {

// At least 2,000 valid UTF-8 strings, the same on every machine and run: every fragment
// alone and with spaces or newlines around it, whitespace runs, digit strings of lengths
// 1..40, contractions in lower, upper and mixed case, then mixtures of fragments drawn
// by a fixed-seed generator. `special_texts` (a vocabulary's control and user-defined
// token texts) are mixed into the prose of some of them.
std::vector<std::string> make_tokenizer_corpus(const std::vector<std::string>& special_texts);

}  // namespace kvlm::testing
