// Fuzz target gguf_reader: arbitrary bytes as a GGUF file, then everything the parse returned is
// read back (metadata values, tensor views within the file) and handed to the readers above it
// (model config, weight binding, tokenizer vocabulary), which must answer with a Status too.
#include <cstring>
#include <memory>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "fuzz/fuzz_targets.h"
#include "gguf/gguf_file.h"
#include "model/llama_weights.h"
#include "model/model_config.h"
#include "model/tokenizer.h"
#include "model/tokenizer_gguf.h"

namespace kvlm::fuzz {
namespace {

// Reads every metadata value through the typed getters its type allows, and prints it.
void touch_metadata(const GgufFile& file) {
  for (const GgufKeyValue& kv : file.metadata()) {
    KVLM_CHECK(file.find(kv.key) != nullptr, "key {} listed but not found", kv.key);
    (void)kv.value.to_display_string();
    (void)file.get_string(kv.key);
    (void)file.get_int(kv.key);
    (void)file.get_float(kv.key);
    (void)file.get_bool(kv.key);
    (void)file.get_string_array(kv.key);
    (void)file.get_float_array(kv.key);
    (void)file.get_int_array(kv.key);
  }
}

// Every tensor's bytes lie in the data section, and its size is what type and shape say.
void touch_tensors(const GgufFile& file) {
  // A file without tensors may end before the padding its data section would start after, so
  // data_offset() may then lie past the end (gguf_file.h promises nothing else for it).
  if (file.tensors().empty()) return;
  KVLM_CHECK(file.data_offset() <= file.file_size(), "data offset {} past the file ({} bytes)", file.data_offset(),
             file.file_size());
  const uint64_t data_bytes = file.file_size() - file.data_offset();
  const uint8_t* data_start = nullptr;
  uint8_t sum = 0;
  for (const GgufTensorInfo& t : file.tensors()) {
    KVLM_CHECK(file.find_tensor(t.name) != nullptr, "tensor listed but not found");
    KVLM_CHECK(!t.dims.empty() && t.dims.size() <= 8, "{} dims", t.dims.size());
    const GgmlTypeTraits traits = ggml_type_traits(t.type);
    KVLM_CHECK(traits.block_size > 0 && t.dims[0] % traits.block_size == 0, "dims[0] {} for block size {}",
               t.dims[0], traits.block_size);
    const uint64_t expected = static_cast<uint64_t>(t.num_elements()) / traits.block_size * traits.block_bytes;
    KVLM_CHECK(t.num_bytes == expected, "tensor has {} bytes, type and shape say {}", t.num_bytes, expected);
    KVLM_CHECK(t.offset <= data_bytes && t.num_bytes <= data_bytes - t.offset,
               "tensor [{}, +{}) outside the {}-byte data section", t.offset, t.num_bytes, data_bytes);
    KVLM_CHECK(t.offset % file.alignment() == 0, "offset {} not aligned to {}", t.offset, file.alignment());
    // All views share one data section start.
    const uint8_t* start = t.data - t.offset;
    if (data_start == nullptr) data_start = start;
    KVLM_CHECK(start == data_start, "tensor views disagree on the data section start");
    // ASan sees the exact allocation: the first and last byte must be readable.
    if (t.num_bytes > 0) sum = static_cast<uint8_t>(sum + t.data[0] + t.data[t.num_bytes - 1]);
  }
  volatile uint8_t sink = sum;
  (void)sink;
}

// What a model load would do with the file short of allocating for its shape.
void touch_model_readers(const GgufFile& file) {
  auto config = ModelConfig::from_gguf(file);
  if (config.ok()) (void)LlamaWeights::bind(file, config.value());
  auto vocab = load_tokenizer_vocab(file);
  if (!vocab.ok()) return;
  auto tokenizer = Tokenizer::create(std::move(vocab.value()));
  if (!tokenizer.ok()) return;
  const Tokenizer& tok = *tokenizer.value();
  const std::vector<TokenId> ids = tok.encode("Hello world <s> 123", tok.add_bos());
  (void)tok.decode(ids);
}

}  // namespace

int gguf_reader_one_input(const uint8_t* data, size_t size) {
  auto file = GgufFile::from_bytes(std::vector<uint8_t>(data, data + size), "fuzz.gguf");
  if (!file.ok()) {
    KVLM_CHECK(!file.status().message().empty(), "an error without a message");
    return 0;
  }
  touch_metadata(*file.value());
  touch_tensors(*file.value());
  touch_model_readers(*file.value());
  return 0;
}

}  // namespace kvlm::fuzz

KVLM_LIBFUZZER_ENTRY(kvlm::fuzz::gguf_reader_one_input)
