// Presets, shapes read from GGUF metadata (incl. deepseek2 MLA keys) and shape validation.
#include "plan/model_shape.h"

#include <vector>

#include <gtest/gtest.h>

#include "gguf/gguf_writer.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

TEST(ModelShape, PresetsHaveThePublishedShapes) {
  auto l2 = find_preset("llama-2-7b");
  ASSERT_TRUE(l2.ok());
  EXPECT_EQ(l2->num_layers, 32);
  EXPECT_EQ(l2->num_kv_heads, 32);
  EXPECT_EQ(l2->context_length, 4096);
  auto l3 = find_preset("LLAMA-3-8B");  // case-insensitive
  ASSERT_TRUE(l3.ok());
  EXPECT_EQ(l3->num_kv_heads, 8);
  EXPECT_EQ(l3->num_params, 8.03e9);
  auto lite = find_preset("deepseek-v2-lite");
  ASSERT_TRUE(lite.ok());
  EXPECT_TRUE(lite->is_mla());
  EXPECT_EQ(lite->latent_dim(), 576);
  EXPECT_EQ(lite->head_dim, 192);
  EXPECT_EQ(lite->v_head_dim, 128);
  EXPECT_EQ(lite->context_length, 32768);
  for (const ModelShape& s : model_presets()) EXPECT_TRUE(validate_model_shape(s).ok()) << s.name;
}

TEST(ModelShape, UnknownPresetListsThePresets) {
  auto r = find_preset("llama-9");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'llama-9'"), std::string::npos);
  EXPECT_NE(r.status().message().find("deepseek-v2-lite"), std::string::npos);
}

TEST(ModelShape, ValidationNamesTheField) {
  ModelShape s = *find_preset("llama-2-7b");
  s.num_layers = 0;
  auto st = validate_model_shape(s);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("layers = 0"), std::string::npos) << st.message();
  s = *find_preset("llama-2-7b");
  s.rope_head_dim = 64;  // rope dims without a latent
  EXPECT_FALSE(validate_model_shape(s).ok());
}

TEST(ModelShape, Stories260KFromGguf) {
  KVLM_REQUIRE_SHARED(path, "stories260K.gguf");
  auto s = load_model_shape(path.string());
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->architecture, "llama");
  EXPECT_EQ(s->name, "stories260K.gguf");
  EXPECT_EQ(s->num_layers, 5);
  EXPECT_EQ(s->num_heads, 8);
  EXPECT_EQ(s->num_kv_heads, 4);
  EXPECT_EQ(s->head_dim, 8);
  EXPECT_EQ(s->v_head_dim, 8);
  EXPECT_EQ(s->context_length, 2048);
  EXPECT_FALSE(s->is_mla());
  EXPECT_GT(s->weight_bytes, 1000000u);  // F32 weights of a ~1.18 MB file
  EXPECT_LT(s->weight_bytes, 1185376u);
  EXPECT_EQ(s->num_params * 4, static_cast<double>(s->weight_bytes));  // all F32
}

// A deepseek2 file with the MLA keys, in the older (per-head key/value lengths) and the newer
// llama.cpp layout (latent as one kv head, per-head sizes in *_mla keys): the same shape.
GgufWriter deepseek2_writer(bool newer_layout) {
  GgufWriter w;
  w.set_string("general.architecture", "deepseek2");
  w.set_u32("deepseek2.block_count", 27);
  w.set_u32("deepseek2.context_length", 163840);
  w.set_u32("deepseek2.embedding_length", 2048);
  w.set_u32("deepseek2.attention.head_count", 16);
  w.set_u32("deepseek2.attention.kv_lora_rank", 512);
  w.set_u32("deepseek2.rope.dimension_count", 64);
  if (newer_layout) {
    w.set_u32("deepseek2.attention.head_count_kv", 1);
    w.set_u32("deepseek2.attention.key_length", 576);
    w.set_u32("deepseek2.attention.value_length", 512);
    w.set_u32("deepseek2.attention.key_length_mla", 192);
    w.set_u32("deepseek2.attention.value_length_mla", 128);
  } else {
    w.set_u32("deepseek2.attention.head_count_kv", 16);
    w.set_u32("deepseek2.attention.key_length", 192);
    w.set_u32("deepseek2.attention.value_length", 128);
  }
  w.add_tensor_f32("token_embd.weight", GgmlType::kQ8_0, {64, 2}, std::vector<float>(128, 0.5f));
  return w;
}

TEST(ModelShape, Deepseek2FromGgufBothLayouts) {
  for (bool newer : {false, true}) {
    auto file = GgufFile::from_bytes(deepseek2_writer(newer).to_bytes(), "ds2.gguf");
    ASSERT_TRUE(file.ok()) << file.status().message();
    auto s = read_model_shape(**file);
    ASSERT_TRUE(s.ok()) << s.status().message();
    EXPECT_EQ(s->architecture, "deepseek2");
    EXPECT_EQ(s->num_layers, 27);
    EXPECT_EQ(s->num_heads, 16);
    EXPECT_EQ(s->num_kv_heads, 16) << newer;
    EXPECT_EQ(s->head_dim, 192) << newer;
    EXPECT_EQ(s->v_head_dim, 128) << newer;
    EXPECT_EQ(s->kv_lora_rank, 512);
    EXPECT_EQ(s->rope_head_dim, 64);
    EXPECT_EQ(s->context_length, 163840);
    EXPECT_EQ(s->num_params, 128.0);
    EXPECT_EQ(s->weight_bytes, 4u * 34);  // four q8_0 blocks
  }
}

TEST(ModelShape, MissingKeyIsNamed) {
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.block_count", 2);
  auto file = GgufFile::from_bytes(w.to_bytes(), "partial.gguf");
  ASSERT_TRUE(file.ok());
  auto s = read_model_shape(**file);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("llama.attention.head_count"), std::string::npos) << s.status().message();
}

TEST(ModelShape, MissingFileIsAnError) {
  auto s = load_model_shape("/nonexistent/model.gguf");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("/nonexistent/model.gguf"), std::string::npos) << s.status().message();
}

}  // namespace
}  // namespace kvlm
