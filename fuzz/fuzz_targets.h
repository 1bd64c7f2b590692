// The fuzz targets' entry points, by name: libFuzzer calls one per executable (KVLM_LIBFUZZER), the
// corpus replay test calls them all over fuzz/corpus/<name>/.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvlm::fuzz {

// Each returns 0 (libFuzzer's convention); a property the code promises and breaks aborts.
int gguf_reader_one_input(const uint8_t* data, size_t size);
int tokenizer_one_input(const uint8_t* data, size_t size);
int llama2c_converter_one_input(const uint8_t* data, size_t size);
int chat_template_one_input(const uint8_t* data, size_t size);
int openai_request_one_input(const uint8_t* data, size_t size);
int engine_api_one_input(const uint8_t* data, size_t size);

struct FuzzTarget {
  const char* name;  // also its corpus directory and scripts/fuzz.sh's name for it
  int (*one_input)(const uint8_t* data, size_t size);
};

inline constexpr FuzzTarget kFuzzTargets[] = {
    {"gguf_reader", gguf_reader_one_input},
    {"tokenizer", tokenizer_one_input},
    {"llama2c_converter", llama2c_converter_one_input},
    {"chat_template", chat_template_one_input},
    {"openai_request", openai_request_one_input},
    {"engine_api", engine_api_one_input},
};

}  // namespace kvlm::fuzz

// Each target file ends with KVLM_LIBFUZZER_ENTRY(its function): in the libFuzzer build that is
// the executable's LLVMFuzzerTestOneInput; in the replay build nothing.
#ifdef KVLM_LIBFUZZER
#define KVLM_LIBFUZZER_ENTRY(function)                                        \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { \
    return function(data, size);                                              \
  }
#else
#define KVLM_LIBFUZZER_ENTRY(function)
#endif
