// `kvlm bench`: prompt-processing and generation speed at given cache depths, as a llama-bench table.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_error.h"
#include "model_source.h"
#include "commands.h"
#include "core/page_cache.h"
#include "eval/machine_probe.h"
#include "eval/speed_bench.h"
#include "kv/kv_type.h"
#include "kv_flags.h"
#include "mla_flag.h"
#include "startup_report.h"
#include "model/llama_model.h"

namespace kvlm::cli {
namespace {

struct BenchFlags {
  std::string model;
  int prompt_tokens = 512;
  int gen_tokens = 128;
  std::vector<int> depths = {0};
  KvTypeFlags kv;
  int threads = 0;
  int reps = 3;
  int block_size = 16;
  int prefill_chunk = 512;
  uint64_t seed = 42;
  bool no_warmup = false;
  std::string fill = "model";
  bool json = false;
  bool probe_only = false;  // --probe: measure the machine, no model
  bool no_probe = false;    // --no-probe: no bandwidth probe before the tests (no % BW column)
  MlaFlag mla;
  bool cold = false;  // drop the file from the page cache before loading
};

nlohmann::json row_json(const SpeedBenchRow& row) {
  return {
      {"test", row.test},
      {"kind", row.is_generation() ? "tg" : "pp"},
      {"prompt_tokens", row.prompt_tokens},
      {"gen_tokens", row.gen_tokens},
      {"depth", row.depth},
      {"type_k", kv_type_name(row.k_type)},
      {"type_v", kv_type_name(row.v_type)},
      {"reps", row.reps},
      {"mean_tps", row.mean_tps},
      {"stddev_tps", row.stddev_tps},
      {"median_tps", row.median_tps},
      {"kv_bytes_per_cached_token", row.kv_bytes_per_cached_token},
      {"samples_tps", row.samples_tps},
      {"samples_s", row.samples_s},
      {"weight_bytes_per_token", row.weight_bytes_per_token},
      {"kv_tokens_read", row.kv_tokens_read},
      {"kv_bytes_per_token", row.kv_bytes_per_token},
      {"bytes_per_token", row.bytes_per_token},
      {"gb_per_s", row.gb_per_s},
      {"bandwidth_share", row.bandwidth_share},
      {"read_bandwidth_share", row.read_bandwidth_share},
  };
}

nlohmann::json probe_json(const BandwidthProbe& b) {
  return {{"median_gb_s", b.median_gb_s},
          {"best_gb_s", b.best_gb_s},
          {"samples_gb_s", b.samples_gb_s},
          {"read_median_gb_s", b.read_median_gb_s},
          {"read_best_gb_s", b.read_best_gb_s},
          {"read_samples_gb_s", b.read_samples_gb_s},
          {"array_bytes", b.array_bytes},
          {"threads", b.threads},
          {"describe", describe(b)}};
}

nlohmann::json probe_json(const MatmulProbe& m) {
  return {{"median_gops", m.median_gops}, {"best_gops", m.best_gops}, {"samples_gops", m.samples_gops},
          {"rows", m.rows},               {"cols", m.cols},           {"tokens", m.tokens},
          {"threads", m.threads},         {"describe", describe(m)}};
}

// `kvlm bench --probe`: the machine alone.
void run_probe(const BenchFlags& f) {
  ThreadPool pool(resolve_threads(f.threads));
  const BandwidthProbe bandwidth = value_or_throw(probe_bandwidth(pool));
  const MatmulProbe matmul = value_or_throw(probe_matmul(pool));
  if (f.json) {
    const nlohmann::json j = {{"bandwidth", probe_json(bandwidth)}, {"matmul", probe_json(matmul)}};
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("memory bandwidth: %s\n", describe(bandwidth).c_str());
  std::printf("matrix throughput: %s\n", describe(matmul).c_str());
}

// --kv-type takes a comma-separated list here ("f16,int8,int4"): one codec per item, each with
// --kv-type-k / --kv-type-v overriding its K or V when given.
std::vector<SpeedBenchCodec> codecs_of(const KvTypeFlags& kv) {
  std::vector<std::pair<KvType, KvType>> pairs;
  size_t begin = 0;
  while (begin <= kv.both.size()) {
    const size_t comma = std::min(kv.both.find(',', begin), kv.both.size());
    KvTypeFlags one = kv;
    one.both = kv.both.substr(begin, comma - begin);
    pairs.emplace_back(one.k_type(), one.v_type());
    begin = comma + 1;
  }
  const KvStorageOptions storage = kv.storage_options_for(pairs);
  std::vector<SpeedBenchCodec> codecs;
  for (const auto& [k_type, v_type] : pairs) codecs.push_back(SpeedBenchCodec{k_type, v_type, storage});
  return codecs;
}

// Which flags the user gave, for the ones that only some requests read.
struct BenchFlagsGiven {
  bool fill = false;
  bool prefill_chunk = false;
};

// A flag that would do nothing in this request is an error naming both flags.
void check_flags_used(const BenchFlags& f, const BenchFlagsGiven& given) {
  const bool any_depth = std::any_of(f.depths.begin(), f.depths.end(), [](int d) { return d > 0; });
  if (given.fill && !any_depth) {
    throw CliError("--fill does nothing with --n-depth 0: it says how a cache depth is filled; give -d N (N > 0) or "
                   "drop --fill");
  }
  const bool model_fills = any_depth && f.fill == "model";
  if (given.prefill_chunk && f.prompt_tokens == 0 && !model_fills) {
    throw CliError(fmt::format("--prefill-chunk does nothing with --n-prompt 0 and {}: nothing is prefilled; "
                               "drop --prefill-chunk, or give -p N or a depth filled by the model (-d N --fill model)",
                               any_depth ? "--fill random-kv" : "no depth"));
  }
}

void run_bench(const BenchFlags& f, const BenchFlagsGiven& given) {
  if (f.probe_only) {
    if (!f.model.empty()) throw CliError("--probe measures the machine alone: drop -m, or drop --probe to bench the model");
    if (f.no_probe) throw CliError("--probe and --no-probe contradict each other: give one");
    return run_probe(f);
  }
  if (f.model.empty()) throw CliError("bench needs a model (-m FILE), or --probe to measure the machine alone");
  check_flags_used(f, given);
  SpeedBenchOptions options;
  options.prompt_tokens = f.prompt_tokens;
  options.gen_tokens = f.gen_tokens;
  options.depths = f.depths;
  options.reps = f.reps;
  options.codecs = codecs_of(f.kv);
  options.block_size = f.block_size;
  options.prefill_chunk = f.prefill_chunk;
  options.warmup = !f.no_warmup;
  if (f.fill == "model") {
    options.fill = SpeedBenchOptions::DepthFill::kModel;
  } else if (f.fill == "random-kv") {
    options.fill = SpeedBenchOptions::DepthFill::kRandomKv;
  } else {
    throw CliError(fmt::format("--fill '{}' is not one of: model, random-kv", f.fill));
  }
  options.seed = f.seed;

  if (f.cold) throw_if_error(drop_from_page_cache(f.model));
  auto model = load_model_file(f.model);
  f.mla.apply(*model, f.model);
  // Checked before the thread pool starts so bad flags fail at once.
  throw_if_error(validate_speed_bench_options(options, model->config()));
  ThreadPool pool(resolve_threads(f.threads));
  // The first forward after load, before anything else touches the weights.
  const FirstToken first = time_first_token(*model, pool, f.prompt_tokens > 0 ? f.prompt_tokens : 1,
                                            options.codecs.front().k_type, options.codecs.front().v_type, f.seed);
  // The roofline: this machine's bandwidth on the same threads, measured before the tests.
  std::optional<BandwidthProbe> bandwidth;
  if (!f.no_probe) bandwidth = value_or_throw(probe_bandwidth(pool));
  SpeedBenchResult r = value_or_throw(run_speed_bench(*model, pool, options));
  if (bandwidth) apply_bandwidth_probe(r, bandwidth->median_gb_s, bandwidth->read_median_gb_s);

  if (f.json) {
    nlohmann::json rows = nlohmann::json::array();
    for (const SpeedBenchRow& row : r.rows) rows.push_back(row_json(row));
    const nlohmann::json j = {
        {"model", f.model},
        {"model_label", r.model_label},
        {"model_bytes", r.model_bytes},
        {"num_params", r.num_params},
        {"backend", r.backend},
        {"mla", model->config().is_mla() ? nlohmann::json(f.mla.mode) : nlohmann::json(nullptr)},
        {"threads", r.threads},
        {"machine", r.machine},
        {"block_size", r.block_size},
        {"prefill_chunk", options.prefill_chunk},
        {"warmup", options.warmup},
        {"fill", f.fill},
        {"seed", r.seed},
        {"weight_bytes_per_token", r.weight_bytes_per_token},
        {"blocks_in_use_at_end", r.blocks_in_use_at_end},
        {"bandwidth", bandwidth ? probe_json(*bandwidth) : nlohmann::json(nullptr)},
        {"startup",
         {{"cold", f.cold},
          {"load", load_json(model->load_stats())},
          {"first_token_prompt_tokens", first.prompt_tokens},
          {"first_token_seconds", first.seconds}}},
        {"rows", rows},
    };
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("%s", format_speed_bench_table(r).c_str());
  std::printf("\n%s\n", r.machine.c_str());
  if (bandwidth) std::printf("memory bandwidth (%% BW and %% read divide by its medians): %s\n", describe(*bandwidth).c_str());
  std::string kv_bytes;  // "f16 32768, int8 16896"
  for (const SpeedBenchCodec& c : options.codecs) {
    for (const SpeedBenchRow& row : r.rows) {
      if (row.k_type != c.k_type || row.v_type != c.v_type) continue;
      const std::string_view kn = kv_type_name(c.k_type), vn = kv_type_name(c.v_type);
      kv_bytes += fmt::format("{}{} {}", kv_bytes.empty() ? "" : ", ",
                              kn == vn ? std::string(kn) : fmt::format("{}/{}", kn, vn), row.kv_bytes_per_cached_token);
      break;
    }
  }
  std::printf("decode bytes/token = weights %.2f MB (every matrix + one embedding row) + KV B/token (%s) x mean "
              "tokens read; seed %llu, block size %d\n",
              static_cast<double>(r.weight_bytes_per_token) / 1e6, kv_bytes.c_str(),
              static_cast<unsigned long long>(r.seed), r.block_size);
  std::printf("start-up%s: %s; first token %.3f s after it (%d prompt tokens, greedy, before any warm-up)\n",
              f.cold ? " (--cold: the file dropped from the page cache)" : "", describe_load(model->load_stats()).c_str(),
              first.seconds, first.prompt_tokens);
  if (options.codecs.size() > 1) {
    std::printf("repetitions interleaved across the %zu codecs; t/s is mean ± sd, --json adds each median and sample\n",
                options.codecs.size());
  }
}

}  // namespace

CLI::App* add_bench_command(CLI::App& app) {
  auto flags = std::make_shared<BenchFlags>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Prompt-processing (pp) and generation (tg) tokens/s at given KV-cache depths (llama-bench style)");
  cmd->add_option("--model,-m", flags->model, "GGUF model file (required unless --probe)");
  cmd->add_option("--n-prompt,-p", flags->prompt_tokens, "prompt tokens per pp test; 0 skips pp")
      ->capture_default_str();
  cmd->add_option("--n-gen,-n", flags->gen_tokens, "generated tokens per tg test; 0 skips tg")->capture_default_str();
  cmd->add_option("--n-depth,-d", flags->depths, "cache depths filled before timing, e.g. 0,2048,8192")
      ->delimiter(',')
      ->capture_default_str();
  flags->kv.add_to(cmd, /*list_allowed=*/true);
  cmd->add_option("--threads,-t", flags->threads, "threads (default: all cores)");
  cmd->add_option("--reps,-r", flags->reps, "repetitions per test")->capture_default_str();
  cmd->add_option("--block-size", flags->block_size, "tokens per KV block")->capture_default_str();
  const CLI::Option* prefill_chunk =
      cmd->add_option("--prefill-chunk", flags->prefill_chunk, "tokens per forward in prefill (like llama-bench -ub)")
          ->capture_default_str();
  cmd->add_option("--seed", flags->seed, "seed of the random token ids")->capture_default_str();
  cmd->add_flag("--no-warmup", flags->no_warmup, "skip the untimed warm-up run of each test");
  cmd->add_flag("--cold", flags->cold,
                "drop the model file from the page cache before loading (posix_fadvise; no root needed), so the "
                "start-up line shows a cold load and first token");
  const CLI::Option* fill =
      cmd->add_option("--fill", flags->fill,
                      "how the depth is filled: model (run the model, like llama-bench) or random-kv (write random "
                      "K/V directly: same attention cost, no model time)")
          ->capture_default_str();
  cmd->add_flag("--json", flags->json, "print one JSON object with every row and number");
  flags->mla.add_to(cmd);
  cmd->add_flag("--probe", flags->probe_only,
                "measure this machine alone: STREAM-triad and read-only memory bandwidth and the Q8_0 matmul's "
                "throughput, on -t "
                "threads (no model)");
  cmd->add_flag("--no-probe", flags->no_probe,
                "skip the bandwidth probe run before the tests (the % BW and % read columns stay empty)");
  cmd->callback([flags, fill, prefill_chunk] {
    run_bench(*flags, BenchFlagsGiven{.fill = fill->count() > 0, .prefill_chunk = prefill_chunk->count() > 0});
  });
  return cmd;
}

}  // namespace kvlm::cli
