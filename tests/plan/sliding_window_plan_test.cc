// Local (sliding-window) layers in the planner: Gemma 3 presets, bytes at a context below and
// above the window, whole-block prediction against a simulated pool, memory fit, GGUF reading,
// validation. Expected numbers are worked out here from the shapes, not asked of the planner.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "model/model_config.h"
#include "plan/kv_advisor.h"
#include "plan/kv_planner.h"
#include "plan/model_shape.h"

namespace kvlm {
namespace {

ModelShape preset_or_die(const char* name) {
  auto shape = find_preset(name);
  EXPECT_TRUE(shape.ok()) << shape.status().message();
  return *shape;
}

const PlanRow& row_for(const Plan& plan, KvType type) {
  for (const PlanRow& r : plan.rows) {
    if (!r.is_baseline && r.option.k_type == type && !r.option.evicts()) return r;
  }
  ADD_FAILURE() << "no row for " << kv_type_name(type);
  return plan.rows.front();
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Gemma 3's rule written out: layer l is global iff (l + 1) is a multiple of 6.
std::vector<int> gemma3_globals(int num_layers) {
  std::vector<int> globals;
  for (int l = 5; l < num_layers; l += 6) globals.push_back(l);
  return globals;
}

TEST(SlidingWindowPlan, GemmaPresetsHaveThePublishedShapes) {
  struct Expected {
    const char* name;
    int layers, heads, kv_heads, head_dim, window;
    int64_t context;
    double params;
  };
  const Expected expected[] = {
      {"gemma-3-1b", 26, 4, 1, 256, 512, 32768, 1.0e9},
      {"gemma-3-4b", 34, 8, 4, 256, 1024, 131072, 3.9e9},
      {"gemma-3-12b", 48, 16, 8, 256, 1024, 131072, 1.2e10},
      {"gemma-3-27b", 62, 32, 16, 128, 1024, 131072, 2.7e10},
  };
  for (const Expected& e : expected) {
    SCOPED_TRACE(e.name);
    const ModelShape s = preset_or_die(e.name);
    EXPECT_EQ(s.architecture, "gemma3");
    EXPECT_EQ(s.num_layers, e.layers);
    EXPECT_EQ(s.num_heads, e.heads);
    EXPECT_EQ(s.num_kv_heads, e.kv_heads);
    EXPECT_EQ(s.head_dim, e.head_dim);
    EXPECT_EQ(s.v_head_dim, e.head_dim);
    EXPECT_EQ(s.context_length, e.context);
    EXPECT_EQ(s.num_params, e.params);
    EXPECT_EQ(s.sliding_window.window, e.window);
    const std::vector<int> globals = gemma3_globals(e.layers);
    EXPECT_EQ(s.num_global_layers(), static_cast<int>(globals.size()));
    EXPECT_EQ(s.num_local_layers(), e.layers - static_cast<int>(globals.size()));
    for (int l = 0; l < e.layers; ++l) {
      const bool global = std::find(globals.begin(), globals.end(), l) != globals.end();
      EXPECT_EQ(s.sliding_window.is_local(l), !global) << "layer " << l;
    }
    EXPECT_TRUE(validate_model_shape(s).ok());
  }
  EXPECT_EQ(preset_or_die("gemma-3-1b").num_local_layers(), 22);  // globals 5, 11, 17, 23
  EXPECT_EQ(global_layer_list(preset_or_die("gemma-3-1b")), "5, 11, 17, 23");
  EXPECT_NE(preset_list().find("gemma-3-27b"), std::string::npos);
  // The llama presets have no local layers.
  EXPECT_FALSE(preset_or_die("llama-3-8b").has_local_layers());
  EXPECT_EQ(global_layer_list(preset_or_die("llama-3.2-1b")).substr(0, 10), "0, 1, 2, 3");
}

// gemma-3-1b f16: one layer stores 1 kv head × (256 + 256) values × 2 B = 1024 B per token.
TEST(SlidingWindowPlan, BytesForContextBelowAtAndAboveTheWindow) {
  const ModelShape s = preset_or_die("gemma-3-1b");
  auto f16 = kv_footprint(s, KvType::kF16, KvType::kF16, CacheForm::kFull, 16);
  ASSERT_TRUE(f16.ok()) << f16.status().message();
  EXPECT_EQ(f16->bytes_per_token(), 26.0 * 1024);  // the full cache's figure
  EXPECT_EQ(f16->layer_bytes_per_block(), 1024u * 16);
  const double per_layer_token = 1024;
  for (int64_t n : {1, 100, 511, 512, 513, 1000, 4096, 32768}) {
    const double expected = per_layer_token * (4.0 * n + 22.0 * std::min<int64_t>(n, 512));
    EXPECT_EQ(kv_bytes_for_context(s, *f16, n), expected) << n;
  }
  // Below the window nothing is saved; at 32,768 tokens 1 - (4·32768 + 22·512) / (26·32768).
  EXPECT_EQ(s.kept_fraction(512), 1.0);
  EXPECT_DOUBLE_EQ(s.kept_fraction(32768), (4.0 * 32768 + 22.0 * 512) / (26.0 * 32768));
  EXPECT_EQ(local_layer_saving(s, 32768), "local layers: 22 of 26 at window 512: 83% of the full cache saved at "
                                          "32,768 tokens");
  EXPECT_EQ(local_layer_saving(preset_or_die("llama-3-8b"), 32768), "");

  // f32 doubles every figure; int8 keeps its ratio to f16 at every context.
  auto f32 = kv_footprint(s, KvType::kF32, KvType::kF32, CacheForm::kFull, 16);
  auto i8 = kv_footprint(s, KvType::kInt8, KvType::kInt8, CacheForm::kFull, 16);
  ASSERT_TRUE(f32.ok() && i8.ok());
  const double int8_ratio = i8->bytes_per_token() / f16->bytes_per_token();
  for (int64_t n : {300, 700, 9000}) {
    EXPECT_EQ(kv_bytes_for_context(s, *f32, n), 2 * kv_bytes_for_context(s, *f16, n)) << n;
    EXPECT_DOUBLE_EQ(kv_bytes_for_context(s, *i8, n), int8_ratio * kv_bytes_for_context(s, *f16, n)) << n;
  }
  // Without local layers the formula is bytes_per_token() × tokens.
  const ModelShape llama = preset_or_die("llama-3-8b");
  auto l16 = kv_footprint(llama, KvType::kF16, KvType::kF16, CacheForm::kFull, 16);
  ASSERT_TRUE(l16.ok());
  EXPECT_EQ(kv_bytes_for_context(llama, *l16, 5000), 131072.0 * 5000);
}

// Blocks a pool that returns the blocks wholly before a step's window holds after that step: the
// step's first query (position n - s) sees positions from n - s - W + 1 on.
int64_t simulated_local_blocks(int64_t n, int64_t s, int64_t w, int64_t bs) {
  const int64_t first = std::max<int64_t>(0, n - s - w + 1);
  return (n - 1) / bs - first / bs + 1;
}

TEST(SlidingWindowPlan, LocalLayerBlocksBoundTheSimulatedPool) {
  EXPECT_EQ(local_layer_blocks(100, 1, 512, 16), 7);    // ceil(100 / 16): nothing left the window
  EXPECT_EQ(local_layer_blocks(512, 1, 512, 16), 32);
  EXPECT_EQ(local_layer_blocks(513, 1, 512, 16), 33);   // ceil(513 / 16) = ceil(512 / 16) + 1
  EXPECT_EQ(local_layer_blocks(100000, 1, 512, 16), 33);
  EXPECT_EQ(local_layer_blocks(600, 100, 512, 16), 38);  // 600 <= 611 live tokens: all 38
  EXPECT_EQ(local_layer_blocks(620, 100, 512, 16), 39);  // min(ceil(620 / 16), ceil(611 / 16) + 1)
  EXPECT_EQ(local_layer_blocks(5000, 100, 512, 16), 40);
  EXPECT_EQ(local_layer_block_cap(1, 1024, 16), 65);
  for (int64_t bs : {1, 16, 32}) {
    for (int64_t w : {1, 7, 64, 100}) {
      for (int64_t s : {1, 5, 64}) {
        for (int64_t n = s; n <= 400; ++n) {
          const int64_t live = simulated_local_blocks(n, s, w, bs);
          const int64_t predicted = local_layer_blocks(n, s, static_cast<int>(w), static_cast<int>(bs));
          ASSERT_GE(predicted, live) << "n " << n << " s " << s << " w " << w << " bs " << bs;
          ASSERT_LE(predicted, live + 1) << "n " << n << " s " << s << " w " << w << " bs " << bs;
          ASSERT_LE(predicted, ceil_div(n, bs));
        }
      }
    }
  }
}

PlanRequest request(int64_t ctx) {
  PlanRequest r;
  r.ctx = ctx;
  r.block_size = 16;
  return r;
}

TEST(SlidingWindowPlan, PlanRowsCountLocalLayersAtTheContext) {
  const ModelShape s = preset_or_die("gemma-3-1b");
  auto plan = make_plan(s, request(32768));
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  const PlanRow& f16 = row_for(*plan, KvType::kF16);
  const double formula = 1024.0 * (4 * 32768 + 22 * 512);
  EXPECT_EQ(f16.formula_bytes, formula);
  EXPECT_EQ(f16.footprint.bytes_per_token(), 26624.0);  // the full cache's
  EXPECT_DOUBLE_EQ(f16.bytes_per_token_at_ctx, formula / 32768);
  EXPECT_EQ(f16.blocks_per_sequence, 2048);       // each global layer: 32768 / 16
  EXPECT_EQ(f16.local_blocks_per_sequence, 33);   // each local layer: ceil(512 / 16) + 1
  EXPECT_EQ(f16.block_bytes_total, (4u * 2048 + 22u * 33) * 16 * 1024);
  // The reference is MHA (4 kv heads) in every layer: 26 × 4 × 512 values × 2 B per token.
  const double baseline = 26.0 * 4 * 512 * 2;
  EXPECT_EQ(plan->baseline_bytes_per_token, baseline);
  EXPECT_DOUBLE_EQ(f16.ratio_to_baseline, 0.25);
  EXPECT_DOUBLE_EQ(f16.ratio_at_ctx, formula / 32768 / baseline);
  const PlanRow& reference = plan->rows.front();
  ASSERT_TRUE(reference.is_baseline);
  EXPECT_EQ(reference.formula_bytes, baseline * 32768);
  EXPECT_EQ(reference.local_blocks_per_sequence, 0);
  EXPECT_EQ(reference.block_bytes_total, 2048u * 26 * 4 * 512 * 2 * 16);

  // Below the window the local layers hold everything: the full cache.
  auto short_plan = make_plan(s, request(300));
  ASSERT_TRUE(short_plan.ok());
  const PlanRow& short_f16 = row_for(*short_plan, KvType::kF16);
  EXPECT_EQ(short_f16.formula_bytes, 26624.0 * 300);
  EXPECT_EQ(short_f16.bytes_per_token_at_ctx, 26624.0);
  EXPECT_EQ(short_f16.local_blocks_per_sequence, 19);  // ceil(300 / 16), as the global layers
  EXPECT_EQ(short_f16.block_bytes_total, 26u * 19 * 16 * 1024);

  // A prompt chunk of 2048 tokens: a local layer holds 512 + 2047 tokens during it.
  PlanRequest chunked = request(32768);
  chunked.step_tokens = 2048;
  auto chunked_plan = make_plan(s, chunked);
  ASSERT_TRUE(chunked_plan.ok());
  EXPECT_EQ(row_for(*chunked_plan, KvType::kF16).local_blocks_per_sequence, ceil_div(512 + 2047, 16) + 1);
  chunked.step_tokens = 0;
  EXPECT_FALSE(make_plan(s, chunked).ok());

  // A model without local layers is unchanged: the figure at ctx is the full one.
  auto llama = make_plan(preset_or_die("llama-3-8b"), request(8192));
  ASSERT_TRUE(llama.ok());
  for (const PlanRow& r : llama->rows) {
    EXPECT_EQ(r.bytes_per_token_at_ctx, r.footprint.bytes_per_token()) << r.option.label;
    EXPECT_EQ(r.ratio_at_ctx, r.ratio_to_baseline) << r.option.label;
    EXPECT_EQ(r.local_blocks_per_sequence, 0);
  }
}

// The longest sequence in 1 GiB (no weights), gemma-3-1b f16 in blocks of 16: one block of one
// layer is 16 KiB, so 65,536 layer-blocks; g blocks per global layer cost 4g + 22·min(g, 33).
TEST(SlidingWindowPlan, MemoryFitReachesFarLongerContexts) {
  const ModelShape s = preset_or_die("gemma-3-1b");
  PlanRequest r = request(32768);
  r.memory_bytes = uint64_t{1} << 30;
  auto plan = make_plan(s, r);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  const PlanRow& f16 = row_for(*plan, KvType::kF16);
  ASSERT_TRUE(f16.fit.has_value());
  int64_t g = 0;
  while (4 * (g + 1) + 22 * std::min<int64_t>(g + 1, 33) <= 65536) ++g;
  EXPECT_EQ(f16.fit->tokens, g * 16);
  EXPECT_EQ(f16.fit->sequences, (int64_t{1} << 30) / ((4 * 2048 + 22 * 33) * 16384));
  // Every layer global: 65,536 / 26 blocks.
  ModelShape full = s;
  full.sliding_window = SlidingWindowConfig{};
  auto full_plan = make_plan(full, r);
  ASSERT_TRUE(full_plan.ok());
  const PlanRow& full_f16 = row_for(*full_plan, KvType::kF16);
  EXPECT_EQ(full_f16.fit->tokens, 65536 / 26 * 16);
  EXPECT_GT(f16.fit->tokens, 6 * full_f16.fit->tokens);
  EXPECT_EQ(full_f16.fit->sequences, (int64_t{1} << 30) / (2048 * 26 * 16384));

  // Every layer local (period past the layer count): memory stops growing at the window, so
  // the longest sequence is as long as the planner goes.
  ModelShape all_local = s;
  all_local.sliding_window.local_layers = local_layers_from_period(27, 26);
  ASSERT_EQ(all_local.num_global_layers(), 0);
  auto local_plan = make_plan(all_local, r);
  ASSERT_TRUE(local_plan.ok());
  EXPECT_EQ(row_for(*local_plan, KvType::kF16).fit->tokens, int64_t{1} << 31);
}

TEST(SlidingWindowPlan, AdviceUsesTheFigureAtTheContext) {
  const ModelShape s = preset_or_die("gemma-3-4b");
  PlanRequest r = request(131072);
  r.memory_bytes = uint64_t{24} << 30;
  for (Scenario scenario : {Scenario::kLimitedMemory, Scenario::kLongChat, Scenario::kLongRecall,
                            Scenario::kConcurrency}) {
    SCOPED_TRACE(std::string(scenario_name(scenario)));
    auto plan = make_advice_plan(s, r, scenario);
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    auto advice = advise(*plan, scenario);
    ASSERT_TRUE(advice.ok()) << advice.status().message();
    ASSERT_TRUE(advice->chosen_row.has_value());
    bool windowed = false, noted = false;
    for (const std::string& reason : advice->reasons) {
      windowed |= reason.find("/token without the sliding window") != std::string::npos;
      noted |= reason.find("29 of 34 layers are local (sliding window of 1024 tokens)") != std::string::npos;
    }
    EXPECT_TRUE(noted);
    EXPECT_TRUE(windowed);
  }
}

TEST(SlidingWindowPlan, ValidationNamesTheProblem) {
  const ModelShape good = preset_or_die("gemma-3-1b");
  auto message = [](const ModelShape& s) {
    const Status st = validate_model_shape(s);
    return st.ok() ? std::string("ok") : st.message();
  };
  ModelShape s = good;
  s.sliding_window.local_layers.pop_back();
  EXPECT_NE(message(s).find("25 local-layer entries for 26 layers"), std::string::npos) << message(s);
  s = good;
  s.sliding_window.local_layers.assign(26, 0);
  EXPECT_NE(message(s).find("names no local layer"), std::string::npos) << message(s);
  s = good;
  s.sliding_window.local_layers[3] = 2;
  EXPECT_NE(message(s).find("entry 3 = 2 must be 0 or 1"), std::string::npos) << message(s);
  s = good;
  s.sliding_window.window = 0;
  EXPECT_NE(message(s).find("26 local-layer entries but no sliding window"), std::string::npos) << message(s);
  s = good;
  s.sliding_window.window = -4;
  EXPECT_NE(message(s).find("sliding window = -4"), std::string::npos) << message(s);
}

GgufWriter shape_writer(const std::string& arch, int layers) {
  GgufWriter w;
  w.set_string("general.architecture", arch);
  w.set_u32(arch + ".block_count", static_cast<uint32_t>(layers));
  w.set_u32(arch + ".context_length", 32768);
  w.set_u32(arch + ".embedding_length", 1152);
  w.set_u32(arch + ".attention.head_count", 4);
  w.set_u32(arch + ".attention.head_count_kv", 1);
  w.set_u32(arch + ".attention.key_length", 256);
  w.set_u32(arch + ".attention.value_length", 256);
  w.add_tensor_f32("token_embd.weight", GgmlType::kF32, {4, 2}, std::vector<float>(8, 0.5f));
  return w;
}

ModelShape read_or_die(const GgufWriter& w) {
  auto file = GgufFile::from_bytes(w.to_bytes(), "swa.gguf");
  EXPECT_TRUE(file.ok()) << file.status().message();
  auto shape = read_model_shape(**file);
  EXPECT_TRUE(shape.ok()) << shape.status().message();
  return shape.ok() ? *shape : ModelShape{};
}

TEST(SlidingWindowPlan, ReadsTheWindowFromGguf) {
  GgufWriter w = shape_writer("gemma3", 26);
  w.set_u32("gemma3.attention.sliding_window", 512);
  ModelShape s = read_or_die(w);
  EXPECT_TRUE(s.warnings.empty());
  EXPECT_EQ(s.sliding_window.window, 512);
  EXPECT_EQ(s.num_local_layers(), 22);
  EXPECT_FALSE(s.sliding_window.is_local(5));

  // A per-layer pattern: layers 0 and 1 local, the rest global.
  std::vector<GgufValue> pattern;
  for (int l = 0; l < 26; ++l) pattern.push_back(GgufValue::make_bool(l < 2));
  w.set("gemma3.attention.sliding_window_pattern", GgufValue::make_array(GgufType::kBool, pattern));
  s = read_or_die(w);
  EXPECT_EQ(s.num_local_layers(), 2);
  EXPECT_TRUE(s.sliding_window.is_local(1));
  EXPECT_FALSE(s.sliding_window.is_local(2));

  // kvlm refuses these windows; plan and inspect still read the shape, full cache, with the reason.
  GgufWriter llama = shape_writer("llama", 4);
  llama.set_u32("llama.attention.sliding_window", 4096);
  s = read_or_die(llama);
  EXPECT_FALSE(s.has_local_layers());
  ASSERT_EQ(s.warnings.size(), 1u);
  EXPECT_NE(s.warnings[0].find("llama.attention.sliding_window"), std::string::npos) << s.warnings[0];
  EXPECT_NE(s.warnings[0].find("every layer planned as global"), std::string::npos) << s.warnings[0];
  s = read_or_die(shape_writer("gemma3", 26));
  ASSERT_EQ(s.warnings.size(), 1u);
  EXPECT_NE(s.warnings[0].find("missing metadata 'gemma3.attention.sliding_window'"), std::string::npos)
      << s.warnings[0];
}

TEST(SlidingWindowPlan, ShapeFromConfigKeepsTheWindow) {
  ModelConfig c;
  c.architecture = "gemma3";
  c.num_layers = 12;
  c.num_heads = 4;
  c.num_kv_heads = 1;
  c.head_dim = 64;
  c.context_length = 8192;
  c.sliding_window.window = 128;
  c.sliding_window.local_layers = local_layers_from_period(6, 12);
  const ModelShape s = model_shape_from_config(c);
  EXPECT_EQ(s.sliding_window.window, 128);
  EXPECT_EQ(s.num_local_layers(), 10);
  EXPECT_TRUE(validate_model_shape(s).ok());
}

// The live-pool prediction: 3 sequences of gemma-3-1b f16 in blocks of 16 (16 KiB per layer-block).
TEST(SlidingWindowPlan, PoolPredictionWithAndWithoutTheWindow) {
  const ModelShape s = preset_or_die("gemma-3-1b");
  PoolQuery q;
  q.block_size = 16;
  q.sequences = {{100, 100}, {513, 1}, {4000, 64}};
  auto windowed = predict_pool_bytes(s, q);
  ASSERT_TRUE(windowed.ok()) << windowed.status().message();
  const double token = 1024;  // one layer, one token
  EXPECT_EQ(windowed->formula_bytes, token * (26 * 100 + (4 * 513 + 22 * 512) + (4 * 4000 + 22 * 512)));
  // Local blocks: 7 (all of 100), 33 (513 > 512), ceil(575 / 16) + 1 = 37 (4000 > 512 + 63).
  const uint64_t block = 16 * 1024;
  const uint64_t expected_blocks = (26 * 7) + (4 * 33 + 22 * 33) + (4 * 250 + 22 * 37);
  EXPECT_EQ(windowed->block_bytes, expected_blocks * block);
  // Slack: a block per global layer; a local layer up to its whole blocks beyond min(tokens, 512).
  const uint64_t slack = 3 * 4 * block + 22 * ((7 * block - 100 * 1024) + (33 * block - 512 * 1024) +
                                              (37 * block - 512 * 1024));
  EXPECT_EQ(windowed->slack_bytes, slack);
  EXPECT_LE(windowed->formula_bytes, static_cast<double>(windowed->block_bytes));
  EXPECT_LE(static_cast<double>(windowed->block_bytes), windowed->formula_bytes + windowed->slack_bytes);

  // Every layer every token: the same as the tokens-only overload, which ignores the window.
  q.local_blocks = LocalLayerBlocks::kEveryToken;
  auto every = predict_pool_bytes(s, q);
  const std::vector<int64_t> tokens = {100, 513, 4000};
  auto plain = predict_pool_bytes(s, KvType::kF16, KvType::kF16, CacheForm::kFull, 16, tokens);
  ASSERT_TRUE(every.ok() && plain.ok());
  EXPECT_EQ(every->formula_bytes, 26 * token * (100 + 513 + 4000));
  EXPECT_EQ(every->block_bytes, 26 * (7 + 33 + 250) * block);
  EXPECT_EQ(every->slack_bytes, 3 * 26 * block);
  EXPECT_EQ(plain->formula_bytes, every->formula_bytes);
  EXPECT_EQ(plain->block_bytes, every->block_bytes);
  EXPECT_EQ(plain->slack_bytes, every->slack_bytes);

  q.sequences = {{10, 0}};
  EXPECT_FALSE(predict_pool_bytes(s, q).ok());
}

}  // namespace
}  // namespace kvlm
