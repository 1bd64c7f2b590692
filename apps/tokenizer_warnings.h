// Prints a model's load-time warnings (ModelConfig::warnings, Tokenizer::warnings) for the commands that load one.
#pragma once

#include <cstdio>
#include <string>

#include "model/llama_model.h"
#include "model/tokenizer.h"

namespace kvlm::cli {

// One "kvlm: warning: tokenizer: ..." line per warning, on stderr so that --json stdout
// stays one object. Commands with --quiet skip the call.
inline void print_tokenizer_warnings(const Tokenizer& tokenizer) {
  for (const std::string& warning : tokenizer.warnings()) {
    std::fprintf(stderr, "kvlm: warning: tokenizer: %s\n", warning.c_str());
  }
}

// The config's warnings ("kvlm: warning: model: ...") and then the tokenizer's.
inline void print_model_warnings(const LlamaModel& model) {
  for (const std::string& warning : model.config().warnings) {
    std::fprintf(stderr, "kvlm: warning: model: %s\n", warning.c_str());
  }
  print_tokenizer_warnings(model.tokenizer());
}

}  // namespace kvlm::cli
