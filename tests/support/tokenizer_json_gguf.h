// Builds a GGUF vocabulary (tokenizer.ggml.*) from a Hugging Face tokenizer.json + tokenizer_config.json.
#pragma once

#include <filesystem>
#include <string>

#include "core/status.h"

namespace kvlm::testing {

// What the GGUF converters write for such a model, so that kvlm's loader and tokenizers
// can be checked against the model's own encoder:
// - model.type "BPE" with byte_fallback (a SentencePiece model HF converted) -> "llama",
//   with scores that rank tokens as the merges do (score = -rank of the first merge that
//   builds the token; tokens no merge builds rank below all), add_space_prefix when the
//   normalizer prepends "▁", "<0xAB>" tokens of type BYTE; otherwise "gpt2" with the merges
//   and tokenizer.ggml.pre = `pre` (GGUF names a pre-tokenizer by type; the caller knows it).
// - added tokens: special -> CONTROL, others -> USER_DEFINED, stored as their plain text;
//   ids no entry uses are UNUSED "[PAD<id>]"; unk_token's id is UNKNOWN.
// - bos/eos from tokenizer_config.json; add_bos_token from it, else whether the
//   post-processor's template starts with a special token.
Status write_tokenizer_json_gguf(const std::filesystem::path& model_dir, const std::string& pre,
                                 const std::filesystem::path& out_path);

}  // namespace kvlm::testing
