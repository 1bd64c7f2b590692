// Prints a tokenizer's load-time warnings (Tokenizer::warnings) for the commands that load a model.
#pragma once

#include <cstdio>
#include <string>

#include "model/tokenizer.h"

namespace kvlm::cli {

// One "kvlm: warning: tokenizer: ..." line per warning, on stderr so that --json stdout
// stays one object. Commands with --quiet skip the call.
inline void print_tokenizer_warnings(const Tokenizer& tokenizer) {
  for (const std::string& warning : tokenizer.warnings()) {
    std::fprintf(stderr, "kvlm: warning: tokenizer: %s\n", warning.c_str());
  }
}

}  // namespace kvlm::cli
