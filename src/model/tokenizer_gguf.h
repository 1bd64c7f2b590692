// load_tokenizer_vocab: reads a TokenizerVocab from a GGUF file's tokenizer.ggml.* metadata.
#pragma once

#include "core/status.h"
#include "gguf/gguf_file.h"
#include "model/tokenizer.h"

namespace kvlm {

// Required: tokenizer.ggml.model and .tokens. Optional, with llama.cpp's defaults:
// .pre (""), .scores, .token_type, .merges, special ids (for "llama": bos 1, eos 2,
// unk 0; otherwise none; the stored "no token" value 0xFFFFFFFF or -1 reads as -1),
// .add_bos_token (true for "llama" and Llama-3 BPE pre types, false otherwise) and
// .add_space_prefix (true for "llama"). Errors name the key; sizes and id ranges are
// checked by Tokenizer::create.
Result<TokenizerVocab> load_tokenizer_vocab(const GgufFile& file);

}  // namespace kvlm
