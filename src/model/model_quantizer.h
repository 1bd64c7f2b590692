// quantize_model: rewrites a GGUF model's weight matrices in a named quantization mix
// (`kvlm quantize`), with llama.cpp's choice of type per tensor role, so tests and benchmarks
// make realistic K-quant files from synthesized F32/F16 models without downloads.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace kvlm {

// A mix as llama-quantize names it: "q4_k_m", "q6_k", "iq4_xs", "q8_0", ...
struct QuantMix {
  std::string name;          // lower case
  GgmlType base;             // most matrices
  uint32_t file_type = 0;    // general.file_type (llama_ftype)
};

Result<QuantMix> parse_quant_mix(std::string_view name);
std::vector<std::string> quant_mix_names();

// What one tensor becomes. `role` is the tensor name without "blk.N." ("attn_v.weight"; a tied
// token_embd is "output.weight");
// layer is N (-1 for tensors outside the blocks); cols the row length.
struct TensorRole {
  std::string role;
  int layer = -1;
  int num_layers = 0;
  int64_t cols = 0;
  int num_gqa = 1;  // query heads per kv head
};
GgmlType quant_type_for(const QuantMix& mix, const TensorRole& tensor);

struct QuantizeOptions {
  std::string in_path;
  std::string out_path;
  QuantMix mix;
  int num_threads = 0;  // 0: all hardware threads
  // Called after each tensor: (tensors done, total, name, type written). May be empty.
  std::function<void(size_t, size_t, const std::string&, GgmlType)> progress;
};

// Reads F32/F16/BF16 weights (a quantized input is an error: requantizing compounds errors)
// and writes every 2-D weight in its type; 1-D tensors (norms, biases, rope_freqs) stay as they are.
Status quantize_model(const QuantizeOptions& options);

}  // namespace kvlm
