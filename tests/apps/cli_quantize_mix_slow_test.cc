// `kvlm quantize` (slow: llama-quantize runs 32 times): the type it writes for every tensor equals the type llama.cpp's own
// llama-quantize writes for the same file and mix (shared/anchors; skipped when absent), on two
// shapes that exercise its rules (layer bands of the _M mixes, GQA bumps, a tied embedding,
// rows that are not whole super-blocks).
#include <map>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "gguf/gguf_file.h"
#include "support/subprocess.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

namespace fs = std::filesystem;
using testing::kvlm_binary;
using testing::run_command;

std::map<std::string, std::string> tensor_types(const std::string& path) {
  std::map<std::string, std::string> out;
  auto file = GgufFile::open(path);
  EXPECT_TRUE(file.ok()) << file.status().message();
  if (!file.ok()) return out;
  for (const GgufTensorInfo& t : (*file)->tensors()) out[t.name] = std::string(ggml_type_name(t.type));
  return out;
}

struct Shape {
  const char* name;
  const char* flags;
};
// 16 layers, GQA 2, separate output; 8 layers, GQA 8, tied, ffn 640 (not 256-aligned).
constexpr Shape kShapes[] = {
    {"untied16", "--layers 16 --dim 256 --heads 4 --kv-heads 2 --head-dim 64 --ffn 768 --vocab 2048 --tied 0"},
    {"tied8", "--layers 8 --dim 256 --heads 8 --kv-heads 1 --head-dim 32 --ffn 640 --vocab 2048 --tied 1"},
};

TEST(KvlmQuantize, TypePerTensorEqualsLlamaQuantize) {
  const auto quantize = testing::shared_anchor("llama.cpp/llama-quantize");
  if (!quantize) GTEST_SKIP() << "shared/anchors/llama.cpp/llama-quantize not found (set KVLM_SHARED)";
  const fs::path dir = testing::scratch_dir("kvlm_quantize_mix");
  for (const Shape& shape : kShapes) {
    const std::string f32 = (dir / (std::string(shape.name) + ".gguf")).string();
    const auto s = run_command(fmt::format("{} synth -o {} {}", kvlm_binary(), f32, shape.flags));
    ASSERT_EQ(s.exit_code, 0) << s.err;
    for (const char* mix : {"Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K",
                            "IQ4_XS", "IQ4_NL", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"}) {
      SCOPED_TRACE(fmt::format("{} {}", shape.name, mix));
      const std::string theirs = (dir / fmt::format("{}-{}-llama.gguf", shape.name, mix)).string();
      const std::string ours = (dir / fmt::format("{}-{}-kvlm.gguf", shape.name, mix)).string();
      const auto q = run_command(fmt::format("LD_LIBRARY_PATH={} {} {} {} {} 2", quantize->parent_path().string(),
                                             quantize->string(), f32, theirs, mix));
      ASSERT_EQ(q.exit_code, 0) << q.err;
      const auto k = run_command(fmt::format("{} quantize {} {} --type {}", kvlm_binary(), f32, ours, mix));
      ASSERT_EQ(k.exit_code, 0) << k.err;
      EXPECT_EQ(tensor_types(ours), tensor_types(theirs));
    }
  }
}

}  // namespace
}  // namespace kvlm
