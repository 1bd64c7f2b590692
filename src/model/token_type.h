// TokenType: the kinds of vocabulary entries, numbered as tokenizer.ggml.token_type stores them.
#pragma once

#include <cstdint>

namespace kvlm {

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class TokenType : int32_t {
  kUndefined = 0,  // treated as normal
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,      // BOS, EOS, chat markers: printed as nothing
  kUserDefined = 4,  // added pieces: printed as their raw text
  kUnused = 5,
  kByte = 6,  // SPM byte fallback "<0xAB>"
};

}  // namespace kvlm
