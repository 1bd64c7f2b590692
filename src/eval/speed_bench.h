// run_speed_bench: prompt-processing and generation tokens/s at given KV-cache depths (`kvlm bench`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "kv/kv_storage.h"
#include "kv/kv_type.h"

namespace kvlm {

class LlamaModel;
struct ModelConfig;
struct LlamaWeights;

// One KV cache configuration a bench measures.
struct SpeedBenchCodec {
  KvType k_type = KvType::kF32;
  KvType v_type = KvType::kF32;
  KvStorageOptions storage;     // the KIVI residual window
};

// What to measure. For each depth d (in the order given):
//   - the cache is filled with d random tokens (untimed, once per depth);
//   - "pp": a prefill of prompt_tokens tokens on top of the d cached tokens, timed, `reps` times;
//   - "tg": gen_tokens decode steps of one token each on top of the d cached tokens, timed, `reps` times.
// Every repetition starts from the same filled state: the sequence's blocks are reserved for
// d + max(p, n) tokens up front, and a repetition only writes slots at positions >= d, which the
// next repetition overwrites (see speed_bench.cc). Tokens are random ids, fixed by `seed`.
// Several codecs are measured side by side, each in its own cache filled the same way, with their
// repetitions interleaved (rep 1 of every codec, then rep 2, ...), so that a machine whose speed
// drifts during the run shifts every codec alike and their ratios stay comparable.
struct SpeedBenchOptions {
  int prompt_tokens = 512;      // -p; 0 skips the pp rows
  int gen_tokens = 128;         // -n; 0 skips the tg rows
  std::vector<int> depths = {0};
  int reps = 3;
  std::vector<SpeedBenchCodec> codecs = {SpeedBenchCodec{}};
  int block_size = 16;
  int prefill_chunk = 512;      // tokens per forward for the depth fill and for pp (llama-bench's ubatch)
  bool warmup = true;           // one untimed run of each test before its repetitions, as llama-bench does
  // How the depth is filled: by running the model over random tokens (as llama-bench does), or by
  // writing random K/V values straight into the cache, which takes no model time. Attention cost
  // does not depend on the values, so kRandomKv measures the same speed and makes deep depths
  // (8192 on a 1B model) affordable on a small machine.
  enum class DepthFill { kModel, kRandomKv };
  DepthFill fill = DepthFill::kModel;
  uint64_t seed = 42;           // random token ids: Rng(seed), id = next_u64() % vocab

  static constexpr int kMaxReps = 1000;
  static constexpr int kMaxDepths = 64;
  static constexpr int kMaxCodecs = 16;
};

// The two tests llama-bench runs: prompt processing (pp) and token generation (tg).
enum class SpeedTest { kPrompt, kGeneration };

// One line of the table: one test at one depth.
struct SpeedBenchRow {
  std::string test;             // "pp512", "tg128", "pp512 @ d2048", "tg128 @ d2048" (llama-bench's names)
  int prompt_tokens = 0;        // p for pp rows, 0 for tg rows
  int gen_tokens = 0;           // n for tg rows, 0 for pp rows
  int depth = 0;
  KvType k_type = KvType::kF32;
  KvType v_type = KvType::kF32;
  int reps = 0;
  std::vector<double> samples_tps;  // [reps] tokens/s of each repetition
  std::vector<double> samples_s;    // [reps] seconds of each repetition
  double mean_tps = 0;
  double stddev_tps = 0;        // sample standard deviation (n - 1); 0 for one repetition
  double median_tps = 0;        // robust to the odd disturbed repetition on a shared machine
  uint64_t kv_bytes_per_cached_token = 0;  // KvStorage::bytes_per_token() of this row's codec
  // Decode traffic, tg rows only (0 for pp rows):
  double weight_bytes_per_token = 0;  // weight bytes one decode step reads
  double kv_tokens_read = 0;          // mean tokens attention reads per step: depth + (n + 1) / 2
  double kv_bytes_per_token = 0;      // kv_tokens_read × KV bytes per cached token (all layers, K + V);
                                      // sliding-window layers count at most their window
  double bytes_per_token = 0;         // weight + KV bytes
  double gb_per_s = 0;                // bytes_per_token × mean_tps / 1e9
  double bandwidth_share = 0;         // gb_per_s / the machine's probed triad bandwidth (0: not probed)
  double read_bandwidth_share = 0;    // gb_per_s / the probed read-only bandwidth (0: not probed)

  bool is_generation() const { return gen_tokens > 0; }
};

struct SpeedBenchResult {
  std::string model_label;      // "llama 292.90K F32": architecture, parameters, main weight type
  uint64_t model_bytes = 0;     // bytes of all tensors
  uint64_t num_params = 0;      // elements of all tensors
  std::string backend = "CPU";
  int threads = 0;
  std::string machine;          // one line: CPU model, features the kernels may use, threads
  int block_size = 0;
  uint64_t seed = 0;
  uint64_t weight_bytes_per_token = 0;  // decode_weight_read_bytes(weights)
  int blocks_in_use_at_end = 0; // blocks the pool still held when the run ended: 0 unless a leak
  double bandwidth_gb_s = 0;    // the machine's triad bandwidth (machine_probe.h); 0: not probed
  double read_bandwidth_gb_s = 0;  // its read-only bandwidth (the same probe); 0: not probed
  std::vector<SpeedBenchRow> rows;
};

// Sets the result's bandwidths and each decode row's share of them (its roofline columns).
void apply_bandwidth_probe(SpeedBenchResult& result, double bandwidth_gb_s, double read_bandwidth_gb_s);

// Checks the options against the model: p, n, depths >= 0 and not all work empty; depth + p + n
// within the model's context; reps in [1, kMaxReps]; 1 to kMaxCodecs codecs; block size and chunk sane.
Status validate_speed_bench_options(const SpeedBenchOptions& options, const ModelConfig& config);

// Weight bytes one decode step reads: every matrix the forward multiplies (q, k, v, o, gate, up,
// down of each layer and the output head, read whole even when tied to the embedding) plus one
// row of the token embedding. Norm vectors (a few KB) are not counted.
uint64_t decode_weight_read_bytes(const LlamaWeights& weights);

// Runs the measurements. Only measures: nothing about speed is asserted.
Result<SpeedBenchResult> run_speed_bench(LlamaModel& model, ThreadPool& pool, const SpeedBenchOptions& options);

// llama-bench's markdown table plus decode traffic columns for tg rows:
// | model | size | params | backend | threads | type_k | type_v | test | t/s | MB/tok | GB/s | % BW | % read |
// (MB = 1e6 bytes moved per decode token; % BW = GB/s over the probed triad bandwidth, % read over
// the probed read-only one; all empty on pp rows, the two shares also when the machine was not probed).
std::string format_speed_bench_table(const SpeedBenchResult& result);

// "1.23 GiB" / "4.56 MiB" and "1.24 B" / "260.00 K", as llama-bench prints size and params.
std::string format_bytes_binary(uint64_t bytes);
std::string format_count_si(uint64_t count);
// "pp512", "tg128 @ d2048".
std::string speed_test_name(SpeedTest test, int tokens, int depth);

}  // namespace kvlm
