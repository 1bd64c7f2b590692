// Loading refuses weight types kvlm cannot compute with in one line per type that names the
// type, how many tensors have it and which; `kvlm inspect` still opens such a file.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/quantize.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "model/llama_model.h"
#include "model/model_synthesizer.h"
#include <fmt/format.h>

#include "support/subprocess.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

// The tiny model with every attn_q and attn_k matrix re-typed to `type` (bytes zero: only the
// binding is under test).
std::string model_with_matrices_of(GgmlType type) {
  const auto dir = testing::scratch_dir(std::string("binding_") + std::string(ggml_type_name(type)));
  SynthOptions options;
  options.shape = *synth_preset("tiny-gqa");
  options.shape.dim = 256;  // whole 256-value super-blocks
  options.shape.head_dim = 32;
  options.out_path = (dir / "f32.gguf").string();
  EXPECT_TRUE(synthesize_model(options).ok());
  auto file = GgufFile::open(options.out_path);
  EXPECT_TRUE(file.ok());
  GgufWriter w;
  for (const GgufKeyValue& kv : (*file)->metadata()) w.set(kv.key, kv.value);
  for (const GgufTensorInfo& t : (*file)->tensors()) {
    const bool retype = t.name.ends_with("attn_q.weight") || t.name.ends_with("attn_k.weight");
    if (!retype) {
      w.add_tensor(t.name, t.type, t.dims, std::vector<uint8_t>(t.data, t.data + t.num_bytes));
      continue;
    }
    const uint64_t bytes = ggml_row_bytes(type, t.dims[0]) * static_cast<uint64_t>(t.dims[1]);
    w.add_tensor(t.name, type, t.dims, std::vector<uint8_t>(bytes, 0));
  }
  const std::string out = (dir / "retyped.gguf").string();
  EXPECT_TRUE(w.write(out).ok());
  return out;
}

TEST(WeightBinding, UnsupportedTypeIsOneClauseNamingTheTensors) {
  for (GgmlType type : {GgmlType::kIQ2_XXS, GgmlType::kTQ2_0}) {
    ASSERT_FALSE(ggml_type_traits(type).supported) << ggml_type_name(type);
    const std::string path = model_with_matrices_of(type);
    auto model = LlamaModel::load(path);
    ASSERT_FALSE(model.ok());
    const std::string& msg = model.status().message();
    SCOPED_TRACE(msg);
    EXPECT_NE(msg.find(fmt::format("weight type {} is not supported by kvlm (4 tensors: blk.0.attn_q.weight, "
                                   "blk.0.attn_k.weight, blk.1.attn_q.weight, ...)",
                                   ggml_type_name(type))),
              std::string::npos);
    // inspect opens it and says why it cannot run.
    const auto r = testing::run_command(testing::kvlm_binary() + " inspect " + path);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("runs in kvlm     no:"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(std::string(ggml_type_name(type))), std::string::npos) << r.out;
  }
}

}  // namespace
}  // namespace kvlm
