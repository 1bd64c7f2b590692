// `kvlm inspect` of files with local (sliding-window) layers: a gemma3 file (metadata of
// gemma-3-1b, one tiny tensor) shows the window, its layers and the saving; a llama file that
// names a window kvlm refuses still opens, with the reason as a warning and a full cache.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gguf/gguf_writer.h"
#include "support/subprocess.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

using testing::kvlm_binary;
using testing::run_command;

// gemma-3-1b's attention shape; weights are one 2-row embedding (inspect needs no more).
std::string write_model(const std::string& arch, const std::string& file_name, int window) {
  GgufWriter w;
  w.set_string("general.architecture", arch);
  w.set_u32(arch + ".block_count", 26);
  w.set_u32(arch + ".context_length", 32768);
  w.set_u32(arch + ".embedding_length", 1152);
  w.set_u32(arch + ".feed_forward_length", 6912);
  w.set_u32(arch + ".attention.head_count", 4);
  w.set_u32(arch + ".attention.head_count_kv", 1);
  w.set_u32(arch + ".attention.key_length", 256);
  w.set_u32(arch + ".attention.value_length", 256);
  w.set_f32(arch + ".attention.layer_norm_rms_epsilon", 1e-6f);
  w.set_f32(arch + ".rope.freq_base", 1000000.0f);
  w.set_u32(arch + ".attention.sliding_window", static_cast<uint32_t>(window));
  w.add_tensor_f32("token_embd.weight", GgmlType::kF32, {1152, 2}, std::vector<float>(2304, 0.25f));
  const std::string path = (testing::scratch_dir("cli_inspect_swa") / file_name).string();
  EXPECT_TRUE(w.write(path).ok());
  return path;
}

TEST(CliInspectSlidingWindow, Gemma3ShowsTheWindowAndTheSaving) {
  const std::string path = write_model("gemma3", "gemma3_1b_shape.gguf", 512);
  const auto r = run_command(kvlm_binary() + " inspect " + path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("architecture     gemma3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("sliding window   512 tokens on 22 of 26 layers (global: 5, 11, 17, 23)"), std::string::npos)
      << r.out;
  // f16: 26 layers × 1 kv head × 512 values × 2 B = 26,624 B per token for the full cache;
  // at 32,768 tokens 1,024 B × (4 × 32,768 + 22 × 512) = 139.0 MiB instead of 832.0 MiB.
  EXPECT_NE(r.out.find("26624.0 bytes/token   139.0 MiB at the full context of 32768 tokens"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("every layer global: 832.0 MiB"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cache saving     local layers: 22 of 26 at window 512: 83% of the full cache saved at "
                       "32,768 tokens"),
            std::string::npos)
      << r.out;

  const auto p = run_command(kvlm_binary() + " plan --model " + path);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_NE(p.out.find("local layers: 22 of 26 at window 512"), std::string::npos) << p.out;
}

TEST(CliInspectSlidingWindow, RefusedWindowIsAWarningNotAFailure) {
  const std::string path = write_model("llama", "llama_with_window.gguf", 4096);
  const auto r = run_command(kvlm_binary() + " inspect " + path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("runs in kvlm     no:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("warning          sliding window not applied, every layer planned as global"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("llama.attention.sliding_window"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("sliding window   "), std::string::npos) << r.out;
  // The full cache: 26,624 B per token, 832.0 MiB at 32,768 tokens.
  EXPECT_NE(r.out.find("26624.0 bytes/token   832.0 MiB at the full context of 32768 tokens"), std::string::npos)
      << r.out;

  const auto p = run_command(kvlm_binary() + " plan --model " + path);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_NE(p.out.find("warning    sliding window not applied"), std::string::npos) << p.out;
  EXPECT_EQ(p.out.find("local layers:"), std::string::npos) << p.out;
}

}  // namespace
}  // namespace kvlm
