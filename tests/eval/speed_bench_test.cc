// Tests of run_speed_bench: option errors, row names, decode byte accounting by hand, a tiny end-to-end run.
#include "eval/speed_bench.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "kv/kv_type.h"
#include "gguf/gguf_file.h"
#include "model/llama_model.h"
#include "model/model_config.h"
#include "model/model_synthesizer.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

std::string synth_tiny(const std::string& preset, GgmlType type) {
  const auto dir = testing::scratch_dir(fmt::format("speed_bench_{}_{}", preset, ggml_type_name(type)));
  SynthOptions options;
  options.shape = synth_preset(preset).value();
  options.weight_type = type;
  options.seed = 7;
  options.out_path = (dir / "model.gguf").string();
  const Status s = synthesize_model(options);
  EXPECT_TRUE(s.ok()) << s.message();
  return options.out_path;
}

ModelConfig config_with_context(int context_length) {
  ModelConfig c;
  c.context_length = context_length;
  return c;
}

// The error for `options`, or "" when they are accepted.
std::string error_of(const SpeedBenchOptions& options, int context_length = 256) {
  return validate_speed_bench_options(options, config_with_context(context_length)).message();
}

TEST(SpeedBenchOptions, RejectsBadValuesWithClearMessages) {
  SpeedBenchOptions ok;
  ok.prompt_tokens = 8;
  ok.gen_tokens = 4;
  ok.depths = {0, 16};
  ok.reps = 2;
  EXPECT_EQ(error_of(ok), "");

  auto with = [&](auto change) {
    SpeedBenchOptions o = ok;
    change(o);
    return error_of(o);
  };
  EXPECT_NE(with([](auto& o) { o.prompt_tokens = -1; }).find("-p -1 must be >= 0"), std::string::npos);
  EXPECT_NE(with([](auto& o) { o.gen_tokens = -3; }).find("-n -3 must be >= 0"), std::string::npos);
  EXPECT_NE(with([](auto& o) { o.prompt_tokens = o.gen_tokens = 0; }).find("nothing to measure"), std::string::npos);
  EXPECT_NE(with([](auto& o) { o.depths = {0, -5}; }).find("-d -5 must be >= 0"), std::string::npos);
  EXPECT_NE(with([](auto& o) { o.depths.clear(); }).find("no depth"), std::string::npos);
  EXPECT_NE(with([](auto& o) { o.depths.assign(SpeedBenchOptions::kMaxDepths + 1, 0); }).find("at most"),
            std::string::npos);
  EXPECT_NE(with([](auto& o) { o.reps = 0; }).find("--reps 0 must be in [1, 1000]"), std::string::npos);
  EXPECT_NE(with([](auto& o) { o.reps = 100000; }).find("--reps 100000"), std::string::npos);
  EXPECT_NE(with([](auto& o) { o.block_size = 0; }).find("--block-size 0"), std::string::npos);
  EXPECT_NE(with([](auto& o) { o.prefill_chunk = 0; }).find("prefill chunk 0"), std::string::npos);
  // The deepest depth plus p plus n must fit the model's context; the message gives the sum.
  const std::string too_deep = with([](auto& o) { o.depths = {0, 250}; });
  EXPECT_NE(too_deep.find("depth 250 + -p 8 + -n 4 = 262 tokens exceeds the model's context of 256"),
            std::string::npos)
      << too_deep;
  EXPECT_EQ(with([](auto& o) { o.depths = {244}; }), "");  // 244 + 8 + 4 = 256 exactly fits
  // Absurd sizes do not overflow the sum.
  EXPECT_NE(with([](auto& o) { o.prompt_tokens = o.gen_tokens = 2'000'000'000; }).find("exceeds"), std::string::npos);
  // Only one of the two tests is fine.
  EXPECT_EQ(with([](auto& o) { o.gen_tokens = 0; }), "");
}

TEST(SpeedBenchNames, FollowLlamaBench) {
  EXPECT_EQ(speed_test_name(SpeedTest::kPrompt, 512, 0), "pp512");
  EXPECT_EQ(speed_test_name(SpeedTest::kGeneration, 128, 0), "tg128");
  EXPECT_EQ(speed_test_name(SpeedTest::kPrompt, 512, 2048), "pp512 @ d2048");
  EXPECT_EQ(speed_test_name(SpeedTest::kGeneration, 128, 8192), "tg128 @ d8192");
  EXPECT_EQ(format_bytes_binary(3ull << 30), "3.00 GiB");
  EXPECT_EQ(format_bytes_binary(1185376), "1.13 MiB");
  EXPECT_EQ(format_bytes_binary(2048), "2.00 KiB");
  EXPECT_EQ(format_count_si(1'235'814'400), "1.24 B");
  EXPECT_EQ(format_count_si(292'800), "292.80 K");
}

// Sum of the GGUF tensor bytes of every matrix a decode step multiplies, read from the file itself.
uint64_t matrix_bytes_from_file(const GgufFile& file) {
  uint64_t total = 0;
  bool has_output = false;
  for (const GgufTensorInfo& t : file.tensors()) {
    const std::string& n = t.name;
    auto ends_with = [&](std::string_view s) { return n.size() >= s.size() && n.ends_with(s); };
    for (const char* m : {"attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "ffn_gate.weight",
                          "ffn_up.weight", "ffn_down.weight"}) {
      if (n.starts_with("blk.") && ends_with(m)) total += t.num_bytes;
    }
    if (n == "output.weight") {
      total += t.num_bytes;
      has_output = true;
    }
  }
  // Tied models multiply the embedding matrix as the output head.
  if (!has_output) total += file.find_tensor("token_embd.weight")->num_bytes;
  return total;
}

TEST(SpeedBenchBytes, DecodeTrafficMatchesHandCount) {
  for (GgmlType type : {GgmlType::kF32, GgmlType::kQ8_0}) {
    SCOPED_TRACE(std::string(ggml_type_name(type)));
    const std::string path = synth_tiny("tiny-gqa", type);
    auto model = LlamaModel::load(path).value();
    auto file = GgufFile::open(path).value();
    const GgufTensorInfo* embd = file->find_tensor("token_embd.weight");
    ASSERT_NE(embd, nullptr);
    const uint64_t embd_row = embd->num_bytes / 512;  // one row of [vocab 512, dim 64]
    const uint64_t expected = matrix_bytes_from_file(*file) + embd_row;
    EXPECT_EQ(decode_weight_read_bytes(model->weights()), expected);
    // tiny-gqa by hand: 2 layers of dim 64, 8 heads and 2 KV heads of 8, FFN 128, vocab 512, tied.
    // Per layer q 64x64, k 16x64, v 16x64, o 64x64, gate/up/down 3 x 128x64 = 34816 values;
    // output head 512x64 = 32768 values; one embedding row of 64.
    const uint64_t values = 2 * 34816 + 32768;
    if (type == GgmlType::kF32) {
      EXPECT_EQ(expected, values * 4 + 64 * 4);
    } else {
      // Q8_0: every row of 64 (or 128) values is 2 (or 4) blocks of 34 bytes, i.e. 34/32 bytes per value.
      EXPECT_EQ(expected, values * 34 / 32 + 64 * 34 / 32);
    }

    ThreadPool pool(1);
    SpeedBenchOptions options;
    options.prompt_tokens = 8;
    options.gen_tokens = 4;
    options.depths = {16};
    options.reps = 1;
    options.codecs = {SpeedBenchCodec{KvType::kF32, KvType::kF16, {}}};
    const SpeedBenchResult r = run_speed_bench(*model, pool, options).value();
    EXPECT_EQ(r.weight_bytes_per_token, expected);
    // K f32 + V f16 per token: 2 layers x 2 KV heads x 8 dims x (4 + 2) bytes.
    for (const SpeedBenchRow& row : r.rows) EXPECT_EQ(row.kv_bytes_per_cached_token, 2u * 2 * 8 * (4 + 2));
    ASSERT_EQ(r.rows.size(), 2u);
    const SpeedBenchRow& tg = r.rows[1];
    ASSERT_TRUE(tg.is_generation());
    // Steps attend over 17, 18, 19, 20 tokens: mean 18.5 = depth 16 + (4 + 1) / 2.
    EXPECT_DOUBLE_EQ(tg.kv_tokens_read, 18.5);
    EXPECT_DOUBLE_EQ(tg.kv_bytes_per_token, 18.5 * 192);
    EXPECT_DOUBLE_EQ(tg.bytes_per_token, static_cast<double>(expected) + 18.5 * 192);
    EXPECT_NEAR(tg.gb_per_s, tg.bytes_per_token * tg.mean_tps / 1e9, 1e-12 * tg.gb_per_s);
    // pp rows carry no decode traffic.
    EXPECT_EQ(r.rows[0].bytes_per_token, 0.0);
    EXPECT_EQ(r.rows[0].gb_per_s, 0.0);
  }
}

// Several codecs in one run: rows per depth and test in codec order, each codec's cache its own,
// every repetition recorded, nothing leaked, and bad codec lists refused.
TEST(SpeedBenchRun, SeveralCodecsGetTheirOwnRowsAndCaches) {
  const std::string path = synth_tiny("tiny-gqa", GgmlType::kF32);
  auto model = LlamaModel::load(path).value();
  ThreadPool pool(1);
  SpeedBenchOptions options;
  options.prompt_tokens = 4;
  options.gen_tokens = 3;
  options.depths = {0, 20};
  options.reps = 2;
  options.fill = SpeedBenchOptions::DepthFill::kRandomKv;
  options.codecs = {SpeedBenchCodec{KvType::kF16, KvType::kF16, {}}, SpeedBenchCodec{KvType::kInt8, KvType::kInt4, {}},
                    SpeedBenchCodec{KvType::kKivi4, KvType::kKivi4, {.kivi_residual_tokens = 0}}};
  const SpeedBenchResult r = run_speed_bench(*model, pool, options).value();
  EXPECT_EQ(r.blocks_in_use_at_end, 0);
  ASSERT_EQ(r.rows.size(), 12u);  // 2 depths x (pp, tg) x 3 codecs
  for (size_t i = 0; i < r.rows.size(); ++i) {
    const SpeedBenchRow& row = r.rows[i];
    const SpeedBenchCodec& codec = options.codecs[i % 3];
    SCOPED_TRACE(row.test);
    EXPECT_EQ(row.k_type, codec.k_type);
    EXPECT_EQ(row.v_type, codec.v_type);
    EXPECT_EQ(row.depth, i < 6 ? 0 : 20);
    EXPECT_EQ(row.is_generation(), (i / 3) % 2 == 1);
    ASSERT_EQ(row.samples_tps.size(), 2u);
    EXPECT_DOUBLE_EQ(row.median_tps, (row.samples_tps[0] + row.samples_tps[1]) / 2);
    EXPECT_GT(row.kv_bytes_per_cached_token, 0u);
  }
  // Fewer bytes per token for the smaller codecs.
  EXPECT_LT(r.rows[1].kv_bytes_per_cached_token, r.rows[0].kv_bytes_per_cached_token);
  EXPECT_LT(r.rows[2].kv_bytes_per_cached_token, r.rows[1].kv_bytes_per_cached_token);
  options.codecs.clear();
  EXPECT_NE(run_speed_bench(*model, pool, options).status().message().find("KV codecs"), std::string::npos);
}

TEST(SpeedBenchRun, TinyEndToEndGivesFiniteNumbersAndConsistentTable) {
  const std::string path = synth_tiny("tiny-gqa", GgmlType::kF32);
  auto model = LlamaModel::load(path).value();
  ThreadPool pool(2);
  SpeedBenchOptions options;
  options.prompt_tokens = 8;
  options.gen_tokens = 4;
  options.depths = {0, 16};
  options.reps = 2;
  options.block_size = 5;  // depth 16 ends inside a block, so repetitions rewrite part of a filled block
  SpeedBenchResult r = run_speed_bench(*model, pool, options).value();

  ASSERT_EQ(r.rows.size(), 4u);
  const std::vector<std::string> names = {"pp8", "tg4", "pp8 @ d16", "tg4 @ d16"};
  for (size_t i = 0; i < r.rows.size(); ++i) {
    const SpeedBenchRow& row = r.rows[i];
    SCOPED_TRACE(row.test);
    EXPECT_EQ(row.test, names[i]);
    EXPECT_EQ(row.depth, i < 2 ? 0 : 16);
    EXPECT_EQ(row.prompt_tokens, i % 2 == 0 ? 8 : 0);
    EXPECT_EQ(row.gen_tokens, i % 2 == 1 ? 4 : 0);
    EXPECT_EQ(row.reps, 2);
    ASSERT_EQ(row.samples_tps.size(), 2u);
    ASSERT_EQ(row.samples_s.size(), 2u);
    for (size_t s = 0; s < 2; ++s) {
      EXPECT_TRUE(std::isfinite(row.samples_tps[s]) && row.samples_tps[s] > 0);
      const int tokens = row.prompt_tokens + row.gen_tokens;
      EXPECT_NEAR(row.samples_tps[s] * row.samples_s[s], tokens, 1e-9 * tokens);
    }
    const double mean = (row.samples_tps[0] + row.samples_tps[1]) / 2;
    EXPECT_NEAR(row.mean_tps, mean, 1e-9 * mean);
    // Two samples: the sample standard deviation is |a - b| / sqrt(2).
    EXPECT_NEAR(row.stddev_tps, std::abs(row.samples_tps[0] - row.samples_tps[1]) / std::sqrt(2.0), 1e-9 * mean);
    if (row.is_generation()) {
      EXPECT_TRUE(std::isfinite(row.gb_per_s) && row.gb_per_s > 0);
      EXPECT_GT(row.bytes_per_token, static_cast<double>(r.weight_bytes_per_token));
    }
  }
  // The deeper tg row reads more KV per token.
  EXPECT_GT(r.rows[3].kv_bytes_per_token, r.rows[1].kv_bytes_per_token);
  EXPECT_EQ(r.blocks_in_use_at_end, 0);
  EXPECT_EQ(r.threads, 2);
  EXPECT_NE(r.machine.find("threads: 2"), std::string::npos) << r.machine;

  // The roofline: each decode row's share of the probed bandwidths (made-up 10 GB/s triad, 16 read).
  apply_bandwidth_probe(r, 10.0, 16.0);
  EXPECT_EQ(r.bandwidth_gb_s, 10.0);
  EXPECT_EQ(r.read_bandwidth_gb_s, 16.0);
  for (const SpeedBenchRow& row : r.rows) {
    EXPECT_EQ(row.bandwidth_share, row.is_generation() ? row.gb_per_s / 10.0 : 0.0) << row.test;
    EXPECT_EQ(row.read_bandwidth_share, row.is_generation() ? row.gb_per_s / 16.0 : 0.0) << row.test;
  }

  // Header, separator and one line per row, each with the same 13 columns.
  const std::string table = format_speed_bench_table(r);
  std::vector<std::string> lines;
  for (size_t begin = 0; begin < table.size();) {
    const size_t end = table.find('\n', begin);
    ASSERT_NE(end, std::string::npos);
    lines.push_back(table.substr(begin, end - begin));
    begin = end + 1;
  }
  ASSERT_EQ(lines.size(), 2 + r.rows.size());
  EXPECT_NE(lines[0].find("| model"), std::string::npos);
  EXPECT_NE(lines[0].find("| type_k | type_v |"), std::string::npos);
  for (const std::string& line : lines) EXPECT_EQ(std::count(line.begin(), line.end(), '|'), 14) << line;
  EXPECT_NE(lines[0].find("| % BW | % read |"), std::string::npos) << lines[0];
  for (size_t i = 0; i < r.rows.size(); ++i) {
    EXPECT_NE(lines[2 + i].find(" " + names[i] + " |"), std::string::npos) << lines[2 + i];
    EXPECT_NE(lines[2 + i].find(fmt::format("{:.2f} ± {:.2f}", r.rows[i].mean_tps, r.rows[i].stddev_tps)),
              std::string::npos)
        << lines[2 + i];
  }
}

TEST(SpeedBenchRun, RejectsDepthBeyondContextBeforeRunning) {
  const std::string path = synth_tiny("tiny-gqa", GgmlType::kF32);
  auto model = LlamaModel::load(path).value();
  ThreadPool pool(1);
  SpeedBenchOptions options;
  options.prompt_tokens = 8;
  options.gen_tokens = 4;
  options.depths = {0, 1024};
  auto r = run_speed_bench(*model, pool, options);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("context of 256"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace kvlm

namespace kvlm {
namespace {

// The random-K/V fill leaves the cache in the state a model fill would (depth tokens held, every
// codec sealed as a forward seals), for every codec, and the timed tests run on top of it.
TEST(SpeedBenchRun, RandomKvFillWorksForEveryCodec) {
  const std::string path = synth_tiny("tiny-gqa", GgmlType::kF32);
  auto model = LlamaModel::load(path).value();
  ThreadPool pool(1);
  for (KvType type : all_kv_types()) {
    SCOPED_TRACE(std::string(kv_type_name(type)));
    SpeedBenchOptions options;
    options.prompt_tokens = 4;
    options.gen_tokens = 3;
    options.depths = {0, 37};
    options.reps = 1;
    options.warmup = false;
    options.codecs = {SpeedBenchCodec{type, type, {.kivi_residual_tokens = 16}}};
    options.fill = SpeedBenchOptions::DepthFill::kRandomKv;
    const SpeedBenchResult r = run_speed_bench(*model, pool, options).value();
    ASSERT_EQ(r.rows.size(), 4u);
    for (const SpeedBenchRow& row : r.rows) EXPECT_TRUE(std::isfinite(row.mean_tps) && row.mean_tps > 0);
    EXPECT_EQ(r.blocks_in_use_at_end, 0);
  }
}

}  // namespace
}  // namespace kvlm
