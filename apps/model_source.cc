#include "model_source.h"

#include <vector>

#include "cli_error.h"
#include "mapped_file_guard.h"

#ifndef KVLM_EMBEDDED_MODEL_PATH
#error "KVLM_EMBEDDED_MODEL_PATH (the GGUF file to embed) is set by CMakeLists.txt"
#endif

// The model's bytes go into .rodata between two symbols. The assembler reads the file, so the
// binary needs nothing beside it at run time; CMake's OBJECT_DEPENDS on the file rebuilds this
// object when it changes. 32-byte alignment is GGUF's default, though loading copies the bytes
// to page-aligned storage anyway (GgufFile::from_bytes).
__asm__(".pushsection .rodata, \"a\"\n"
        ".balign 32\n"
        ".globl kvlm_embedded_model_begin\n"
        ".hidden kvlm_embedded_model_begin\n"
        ".type kvlm_embedded_model_begin, @object\n"
        "kvlm_embedded_model_begin:\n"
        ".incbin \"" KVLM_EMBEDDED_MODEL_PATH "\"\n"
        ".globl kvlm_embedded_model_end\n"
        ".hidden kvlm_embedded_model_end\n"
        "kvlm_embedded_model_end:\n"
        ".size kvlm_embedded_model_begin, kvlm_embedded_model_end - kvlm_embedded_model_begin\n"
        ".popsection\n");

extern "C" {
__attribute__((visibility("hidden"))) extern const uint8_t kvlm_embedded_model_begin[];
__attribute__((visibility("hidden"))) extern const uint8_t kvlm_embedded_model_end[];
}

namespace kvlm::cli {

std::span<const uint8_t> embedded_model_bytes() {
  return {kvlm_embedded_model_begin, static_cast<size_t>(kvlm_embedded_model_end - kvlm_embedded_model_begin)};
}

std::unique_ptr<LlamaModel> load_model_file(const std::string& path) {
  std::unique_ptr<LlamaModel> model = value_or_throw(LlamaModel::load(path));
  guard_mapped_file(model->file());
  return model;
}

std::unique_ptr<LlamaModel> load_model_or_embedded(const std::string& path) {
  if (!path.empty()) return load_model_file(path);
  const std::span<const uint8_t> bytes = embedded_model_bytes();
  return value_or_throw(
      LlamaModel::load_from_bytes(std::vector<uint8_t>(bytes.begin(), bytes.end()), kEmbeddedModelName));
}

}  // namespace kvlm::cli
