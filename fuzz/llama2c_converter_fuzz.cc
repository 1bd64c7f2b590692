// Fuzz target llama2c_converter: the llama2.c converter's inputs, a checkpoint header and a
// tokenizer.bin, written to temp files (its API takes paths).
// Input: 28 bytes of header (7 × int32), one options byte, then the tokenizer file. The
// checkpoint's weights are not fuzzed (they are copied, never interpreted): when the header
// implies a small file, the options byte says whether the checkpoint gets exactly that size
// (so conversion runs) or only the header (the size check answers).
// Asserted: a conversion that succeeds writes a file that parses as GGUF with a valid model
// config, bindable weights and a vocabulary the tokenizer accepts.
#include <cstring>
#include <string>

#include "core/check.h"
#include "core/dtype.h"
#include "fuzz/fuzz_input.h"
#include "fuzz/fuzz_targets.h"
#include "fuzz/fuzz_temp_dir.h"
#include "gguf/gguf_file.h"
#include "model/llama2c_converter.h"
#include "model/llama_weights.h"
#include "model/model_config.h"
#include "model/tokenizer.h"
#include "model/tokenizer_gguf.h"

namespace kvlm::fuzz {
namespace {

constexpr size_t kHeaderBytes = 28;
// Larger checkpoints are only checked for their size, not converted (keeps each run fast).
constexpr uint64_t kMaxConvertedBytes = 256 * 1024;

constexpr GgmlType kWeightTypes[] = {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0,
                                     GgmlType::kQ4_0};

void check_converted(const std::string& path) {
  auto file = GgufFile::open(path);
  KVLM_CHECK(file.ok(), "converted file does not parse: {}", file.status().message());
  auto config = ModelConfig::from_gguf(*file.value());
  KVLM_CHECK(config.ok(), "converted file has no valid config: {}", config.status().message());
  auto weights = LlamaWeights::bind(*file.value(), config.value());
  KVLM_CHECK(weights.ok(), "converted file's weights do not bind: {}", weights.status().message());
  auto vocab = load_tokenizer_vocab(*file.value());
  KVLM_CHECK(vocab.ok(), "converted file's vocabulary does not load: {}", vocab.status().message());
  auto tokenizer = Tokenizer::create(std::move(vocab.value()));
  KVLM_CHECK(tokenizer.ok(), "converted file's vocabulary is refused: {}", tokenizer.status().message());
}

}  // namespace

int llama2c_converter_one_input(const uint8_t* data, size_t size) {
  if (size < kHeaderBytes + 1) return 0;
  const std::string header(reinterpret_cast<const char*>(data), kHeaderBytes);
  FuzzInput in(data + kHeaderBytes, size - kHeaderBytes);
  const uint8_t options = in.take_byte();
  const std::string_view tokenizer_bytes = in.take_rest();

  const std::string checkpoint_path = write_temp_file("model.bin", header);
  const std::string tokenizer_path = write_temp_file("tokenizer.bin", tokenizer_bytes);
  auto config = read_llama2c_config(checkpoint_path);
  if (!config.ok()) {
    // The header alone cannot be a whole checkpoint, but its fields may still be fine: read the
    // tokenizer against the vocab_size it names, and make a file of the size it implies.
    int32_t fields[7];
    std::memcpy(fields, header.data(), kHeaderBytes);
    const int64_t vocab_size = fields[5] < 0 ? -int64_t{fields[5]} : fields[5];
    if (vocab_size <= 4096) (void)read_llama2c_tokenizer(tokenizer_path, static_cast<int>(vocab_size));

    Llama2cConfig c;
    c.dim = fields[0], c.hidden_dim = fields[1], c.num_layers = fields[2], c.num_heads = fields[3];
    c.num_kv_heads = fields[4], c.vocab_size = static_cast<int>(vocab_size), c.seq_len = fields[6];
    c.shared_classifier = fields[5] > 0;
    const bool plausible = c.dim > 0 && c.hidden_dim > 0 && c.num_layers > 0 && c.num_heads > 0 && c.num_kv_heads > 0 &&
                           c.vocab_size > 0 && c.seq_len > 0 && c.dim <= 4096 && c.hidden_dim <= 4096 &&
                           c.num_layers <= 16 && c.vocab_size <= 4096 && c.seq_len <= 4096 && c.num_heads <= c.dim;
    if (!plausible || (options & 1) == 0) return 0;
    const uint64_t bytes = c.expected_file_bytes();
    if (bytes > kMaxConvertedBytes) return 0;
    std::string checkpoint = header;
    checkpoint.resize(static_cast<size_t>(bytes), static_cast<char>(options & 0x3C));  // weights: small floats
    write_temp_file("model.bin", checkpoint);
    config = read_llama2c_config(checkpoint_path);
    if (!config.ok()) return 0;
  }
  KVLM_CHECK(config->vocab_size > 0 && config->dim % config->num_heads == 0, "accepted a bad header");
  (void)read_llama2c_tokenizer(tokenizer_path, config->vocab_size);

  Llama2cConvertOptions convert;
  convert.checkpoint_path = checkpoint_path;
  convert.tokenizer_path = tokenizer_path;
  convert.out_path = (fuzz_temp_dir() / "out.gguf").string();
  convert.weight_type = kWeightTypes[(options >> 5) % std::size(kWeightTypes)];
  if (config->expected_file_bytes() > kMaxConvertedBytes) return 0;
  if (convert_llama2c(convert).ok()) check_converted(convert.out_path);
  return 0;
}

}  // namespace kvlm::fuzz

KVLM_LIBFUZZER_ENTRY(kvlm::fuzz::llama2c_converter_one_input)
