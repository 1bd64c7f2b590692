// convert_llama2c: turns a llama2.c legacy checkpoint and its tokenizer into a llama GGUF file.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/status.h"
#include "model/synthetic_vocab.h"

namespace kvlm {

// The 7 × int32 header of a llama2.c legacy checkpoint ("version 0", as run.c reads it).
struct Llama2cConfig {
  int dim = 0;
  int hidden_dim = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int vocab_size = 0;              // |stored value|
  int seq_len = 0;
  bool shared_classifier = true;   // stored vocab_size > 0: the classifier is token_embedding

  int head_size() const { return dim / num_heads; }
  // Bytes the whole checkpoint must have: header, weights, freq_cis tables, and wcls when not shared.
  uint64_t expected_file_bytes() const;
};

// Reads and validates the header; the file size must match the header exactly.
// Errors name the file and the offending field.
Result<Llama2cConfig> read_llama2c_config(const std::string& checkpoint_path);

// Reads a llama2.c tokenizer.bin (int32 max_token_length, then per id: f32 score, int32 length,
// bytes) holding exactly vocab_size tokens, as GGUF SentencePiece pieces: spaces become "▁",
// ids 0/1/2 are named <unk>/<s>/</s>, "<0xAB>" pieces are byte tokens.
Result<SpmVocab> read_llama2c_tokenizer(const std::string& tokenizer_path, int vocab_size);

struct Llama2cConvertOptions {
  std::string checkpoint_path;
  std::string tokenizer_path;
  std::string out_path;
  std::string name;                     // general.name; empty: the checkpoint's file stem
  GgmlType weight_type = GgmlType::kF32;// matrices: f32, f16, bf16, q8_0 or q4_0. Norms stay f32, and a
                                        // matrix whose rows do not fill whole blocks stays f32.
};

// Writes a GGUF with architecture "llama". Q/K rows are not permuted: llama2.c rotates
// adjacent pairs, which is what the llama architecture's normal RoPE does. A shared
// classifier is expressed by omitting output.weight.
Status convert_llama2c(const Llama2cConvertOptions& options);

}  // namespace kvlm
