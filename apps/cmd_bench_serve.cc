// `kvlm bench-serve`: many synthetic requests through one Engine, C at a time; throughput, latency, pool use.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_error.h"
#include "model_source.h"
#include "commands.h"
#include "core/check.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "engine/engine_metrics.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "kv/kv_type.h"
#include "kv_flags.h"
#include "model/llama_model.h"

namespace kvlm::cli {
namespace {

struct BenchServeFlags {
  std::string model;
  int requests = 32;
  int concurrency = 4;
  int prompt_tokens = 128;
  int output_tokens = 32;
  double shared_prefix = 0.5;  // fraction of each prompt identical across requests
  int pool_blocks = 0;         // 0 (not given): enough for `concurrency` requests, see default_pool_blocks
  int block_size = 16;
  int max_batch_tokens = 512;
  int max_seqs = 0;  // 0 (not given): --concurrency
  KvTypeFlags kv;
  int threads = 0;
  uint64_t seed = 42;
  // Every request's sampling (its seed: --seed + 1 + its index). The default is greedy; OpenAI's
  // defaults are --temp 1 with no cut, whose draws walk the whole vocabulary.
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  bool json = false;
  bool quiet = false;
};

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Which flags the user gave, for those whose default is computed from the others.
struct BenchServeFlagsGiven {
  bool pool_blocks = false;
  bool max_seqs = false;
};

SamplerParams sampler_params(const BenchServeFlags& f, int request_idx) {
  SamplerParams p;
  p.temperature = f.temperature;
  p.top_k = f.top_k;
  p.top_p = f.top_p;
  p.min_p = f.min_p;
  p.seed = f.seed + 1 + static_cast<uint64_t>(request_idx);
  return p;
}

std::string sampling_name(const BenchServeFlags& f) {
  if (f.temperature <= 0.0f) return "greedy";
  return fmt::format("temperature {:g}, top-k {}, top-p {:g}, min-p {:g}", f.temperature,
                     f.top_k > 0 ? std::to_string(f.top_k) : std::string("off"), f.top_p, f.min_p);
}

// Checks that need no model, so a typo fails before the model loads.
void check_flags(const BenchServeFlags& f, const BenchServeFlagsGiven& given) {
  if (f.requests < 1) throw CliError(fmt::format("--requests {} must be >= 1", f.requests));
  if (f.concurrency < 1 || f.concurrency > f.requests) {
    throw CliError(fmt::format("--concurrency {} must be in [1, --requests {}]", f.concurrency, f.requests));
  }
  if (f.prompt_tokens < 1) throw CliError(fmt::format("--prompt-tokens {} must be >= 1", f.prompt_tokens));
  if (f.output_tokens < 1) throw CliError(fmt::format("--output-tokens {} must be >= 1", f.output_tokens));
  if (!(f.shared_prefix >= 0.0 && f.shared_prefix <= 1.0)) {
    throw CliError(fmt::format("--shared-prefix {} must be a fraction in [0, 1]", f.shared_prefix));
  }
  if (given.pool_blocks && f.pool_blocks < 1) {
    throw CliError(fmt::format("--pool-blocks {} must be >= 1 (omit it for a pool that fits --concurrency requests)",
                               f.pool_blocks));
  }
  if (given.max_seqs && f.max_seqs < 1) throw CliError(fmt::format("--max-seqs {} must be >= 1", f.max_seqs));
  const Status sampling = sampler_params(f, 0).validate();
  if (!sampling.ok()) throw CliError(sampling.message());
  // --block-size and --max-batch-tokens are checked by Engine::create, with their flag names.
}

// Prompts of `num_tokens` random ids in [1, vocab) that are neither BOS nor EOS: the first
// `num_shared` equal in every prompt, the rest each request's own. Request i's suffix comes from
// its own generator, so a prompt does not depend on how many requests there are.
std::vector<std::vector<TokenId>> make_prompts(int num_requests, int num_tokens, int num_shared, int vocab_size,
                                               const Tokenizer& tokenizer, uint64_t seed) {
  const TokenId bos = tokenizer.bos_id(), eos = tokenizer.eos_id();
  auto in_range = [&](TokenId id) { return id >= 1 && id < vocab_size; };
  const int num_usable = vocab_size - 1 - (in_range(bos) ? 1 : 0) - (in_range(eos) && eos != bos ? 1 : 0);
  if (num_usable < 1) {
    throw CliError(
        fmt::format("the model's vocabulary of {} has no token id in [1, {}) that is neither BOS nor EOS "
                    "to build prompts from",
                    vocab_size, vocab_size));
  }
  auto draw = [&](Rng& rng) {
    for (;;) {
      const auto id = static_cast<TokenId>(1 + rng.next_u64() % static_cast<uint64_t>(vocab_size - 1));
      if (id != bos && id != eos) return id;
    }
  };
  Rng shared_rng(seed);
  std::vector<TokenId> shared(static_cast<size_t>(num_shared));
  for (TokenId& id : shared) id = draw(shared_rng);
  std::vector<std::vector<TokenId>> prompts(static_cast<size_t>(num_requests));
  for (int i = 0; i < num_requests; ++i) {
    Rng own_rng(seed ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(i + 1)));
    std::vector<TokenId>& prompt = prompts[static_cast<size_t>(i)];
    prompt = shared;
    while (static_cast<int>(prompt.size()) < num_tokens) prompt.push_back(draw(own_rng));
  }
  return prompts;
}

// Linear interpolation between closest ranks (numpy's default); nullopt when there are no samples.
std::optional<double> percentile(std::vector<double> values, double q) {
  if (values.empty()) return std::nullopt;
  std::sort(values.begin(), values.end());
  const double pos = q * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos)), hi = static_cast<size_t>(std::ceil(pos));
  return values[lo] + (values[hi] - values[lo]) * (pos - static_cast<double>(lo));
}

std::optional<double> mean(const std::vector<double>& values) {
  if (values.empty()) return std::nullopt;
  double sum = 0;
  for (double v : values) sum += v;
  return sum / static_cast<double>(values.size());
}

// What the callbacks record. They run inside engine->step() on the main thread, so the main loop
// reads this between steps without a lock; callbacks only record, they never step or submit.
struct Completions {
  int num_in_flight = 0;
  int num_finished = 0;             // any last event
  int64_t num_tokens_streamed = 0;  // token events, for the progress line
  std::vector<RequestStats> stats;  // requests that ended with stop or length
  std::vector<std::string> errors;  // "request 3: error: ..." for every other end
};

struct ServeResult {
  double wall_seconds = 0;
  std::vector<RequestStats> stats;
  std::vector<std::string> errors;
  EngineMetrics metrics;
  int blocks_leaked = 0;       // engine->leaked_blocks()
  int blocks_used_at_end = 0;  // cache().num_used_blocks() once idle
  int local_peak_pinned = 0;   // sliding-window layers' slots pinned at once, at most
  int local_pinned_at_end = 0; // once idle (must be 0)
};

// The progress line on stderr: only for a person watching a terminal.
class Progress {
 public:
  Progress(int num_requests, bool enabled) : num_requests_(num_requests), enabled_(enabled) {}

  void update(const Completions& c, double elapsed) {
    if (!enabled_ || (elapsed - last_shown_ < 0.2 && c.num_finished < num_requests_)) return;
    last_shown_ = elapsed;
    std::fprintf(stderr, "\rbench-serve: %d / %d requests done, %.1f output tok/s   ", c.num_finished, num_requests_,
                 elapsed > 0 ? static_cast<double>(c.num_tokens_streamed) / elapsed : 0.0);
    std::fflush(stderr);
    shown_ = true;
  }
  void finish() {
    if (shown_) std::fprintf(stderr, "\n");
  }

 private:
  int num_requests_;
  bool enabled_;
  bool shown_ = false;
  double last_shown_ = -1;
};

// Keeps `concurrency` requests in flight: the main loop steps the engine and, after each step,
// submits the next prompts for the ones that finished in it (a submission made inside a
// callback would wait for the next step all the same).
ServeResult serve(Engine& engine, const std::vector<std::vector<TokenId>>& prompts, const BenchServeFlags& f,
                  Progress& progress) {
  Completions done;
  int next = 0;
  const int num_requests = static_cast<int>(prompts.size());
  auto submit_up_to_concurrency = [&] {
    while (done.num_in_flight < f.concurrency && next < num_requests) {
      const int idx = next++;
      RequestOptions request;
      request.prompt = prompts[static_cast<size_t>(idx)];
      request.sampler = sampler_params(f, idx);
      request.max_tokens = f.output_tokens;
      request.stop_at_eos = false;  // every request produces exactly --output-tokens
      auto on_event = [&done, idx](const TokenEvent& event) {
        if (event.token >= 0) ++done.num_tokens_streamed;
        if (event.finish == FinishReason::kNone) return;
        --done.num_in_flight;
        ++done.num_finished;
        if (event.finish == FinishReason::kStop || event.finish == FinishReason::kLength) {
          done.stats.push_back(*event.stats);
        } else {
          done.errors.push_back(fmt::format("request {}: {}{}{}", idx, finish_reason_name(event.finish),
                                            event.error.empty() ? "" : ": ", event.error));
        }
      };
      Result<RequestId> id = engine.submit(std::move(request), std::move(on_event));
      if (!id.ok()) {
        engine.stop();  // cancels the requests in flight while `done`, which their callbacks write, still exists
        progress.finish();
        throw CliError(fmt::format("request {}: {}", idx, id.status().message()));
      }
      ++done.num_in_flight;
    }
  };

  const Clock::time_point start = Clock::now();
  submit_up_to_concurrency();
  while (done.num_finished < num_requests) {
    // Every request submitted and not finished is waiting or running, so there is work.
    const bool stepped = engine.step();
    KVLM_CHECK(stepped, "the engine went idle with {} of {} requests finished, {} in flight", done.num_finished,
               num_requests, done.num_in_flight);
    submit_up_to_concurrency();
    progress.update(done, seconds_since(start));
  }
  ServeResult r;
  r.wall_seconds = seconds_since(start);
  progress.finish();
  engine.run_until_idle();
  r.stats = std::move(done.stats);
  r.errors = std::move(done.errors);
  r.metrics = engine.metrics();
  r.blocks_leaked = engine.leaked_blocks();
  r.blocks_used_at_end = engine.cache().num_used_blocks();
  r.local_peak_pinned = engine.storage().peak_local_blocks_in_use();
  r.local_pinned_at_end = engine.storage().local_blocks_in_use();
  return r;
}

// Per-request latencies and the totals the report shows.
struct Summary {
  int num_completed = 0;
  int64_t num_prompt_tokens = 0;
  int64_t num_output_tokens = 0;
  int64_t num_cached_prompt_tokens = 0;  // supplied by the prefix cache at each request's first admission
  std::vector<double> ttft;              // seconds, one per completed request
  std::vector<double> tpot;              // seconds, one per completed request with >= 2 tokens
  int num_short = 0;                     // completed with fewer than --output-tokens (must be 0)
};

Summary summarize(const ServeResult& r, int output_tokens) {
  Summary s;
  for (const RequestStats& st : r.stats) {
    ++s.num_completed;
    s.num_prompt_tokens += st.prompt_tokens;
    s.num_output_tokens += st.completion_tokens;
    s.num_cached_prompt_tokens += st.cached_prompt_tokens;
    s.ttft.push_back(st.time_to_first_token);
    // The mean gap between a request's output tokens: (last token - first token) / (tokens - 1).
    if (st.completion_tokens >= 2) s.tpot.push_back(st.mean_inter_token);
    if (st.completion_tokens != output_tokens) ++s.num_short;
  }
  return s;
}

nlohmann::json json_or_null(std::optional<double> v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); }

double ratio(double num, double den) { return den > 0 ? num / den : 0.0; }

struct RunSetup {
  std::string k_type, v_type;
  int shared_tokens = 0;
  int pool_blocks = 0;
  bool pool_auto = false;
  int max_seqs = 0;
  int threads = 0;
};

nlohmann::json to_json(const BenchServeFlags& f, const RunSetup& setup, const ServeResult& r, const Summary& s) {
  const EngineMetrics& m = r.metrics;
  return {
      {"model", f.model},
      {"config",
       {{"requests", f.requests},
        {"concurrency", f.concurrency},
        {"prompt_tokens", f.prompt_tokens},
        {"output_tokens", f.output_tokens},
        {"shared_prefix", f.shared_prefix},
        {"shared_prefix_tokens", setup.shared_tokens},
        {"type_k", setup.k_type},
        {"type_v", setup.v_type},
        {"block_size", f.block_size},
        {"pool_blocks", setup.pool_blocks},
        {"pool_blocks_auto", setup.pool_auto},
        {"max_batch_tokens", f.max_batch_tokens},
        {"max_seqs", setup.max_seqs},
        {"threads", setup.threads},
        {"seed", f.seed},
        {"sampling", sampling_name(f)},
        {"temperature", f.temperature},
        {"top_k", f.top_k},
        {"top_p", f.top_p},
        {"min_p", f.min_p}}},
      {"requests_completed", s.num_completed},
      {"requests_errored", static_cast<int>(r.errors.size())},
      {"requests_short", s.num_short},
      {"errors", r.errors},
      {"prompt_tokens_total", s.num_prompt_tokens},
      {"output_tokens_total", s.num_output_tokens},
      {"wall_seconds", r.wall_seconds},
      {"requests_per_s", ratio(s.num_completed, r.wall_seconds)},
      {"output_tokens_per_s", ratio(static_cast<double>(s.num_output_tokens), r.wall_seconds)},
      {"total_tokens_per_s", ratio(static_cast<double>(s.num_prompt_tokens + s.num_output_tokens), r.wall_seconds)},
      {"ttft_s",
       {{"p50", json_or_null(percentile(s.ttft, 0.5))},
        {"p99", json_or_null(percentile(s.ttft, 0.99))},
        {"mean", json_or_null(mean(s.ttft))}}},
      {"tpot_s",
       {{"p50", json_or_null(percentile(s.tpot, 0.5))},
        {"p99", json_or_null(percentile(s.tpot, 0.99))},
        {"mean", json_or_null(mean(s.tpot))},
        {"method",
         "per request: mean gap between its output tokens = (last - first token) / "
         "(completion_tokens - 1)"}}},
      {"prefix",
       {{"hit_tokens", m.prefix_hit_tokens},
        {"query_tokens", m.prefix_queries_tokens},
        {"hit_rate", ratio(static_cast<double>(m.prefix_hit_tokens), static_cast<double>(m.prefix_queries_tokens))},
        {"cached_prompt_tokens", s.num_cached_prompt_tokens}}},
      {"pool",
       {{"blocks_total", m.blocks_total},
        {"peak_blocks_used", m.peak_blocks_used},
        {"bytes_per_block", m.bytes_per_block},
        {"peak_bytes", static_cast<uint64_t>(m.peak_blocks_used) * m.bytes_per_block},
        {"total_bytes", static_cast<uint64_t>(m.blocks_total) * m.bytes_per_block},
        {"blocks_leaked", r.blocks_leaked},
        {"blocks_used_at_end", r.blocks_used_at_end},
        {"local_slots_total", m.local_slots_total},
        {"local_bytes_per_slot", m.local_bytes_per_slot},
        {"local_peak_pinned", r.local_peak_pinned},
        {"local_pinned_at_end", r.local_pinned_at_end}}},
      {"preemptions", m.preemptions},
      {"steps", m.steps},
      {"tokens_computed", m.tokens_computed},
  };
}

std::string ms(std::optional<double> seconds) {
  return seconds ? fmt::format("{:.2f} ms", *seconds * 1e3) : std::string("n/a (1 output token)");
}

std::string human_bytes(uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024.0 * 1024.0) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024.0 * 1024.0));
  if (b >= 1024.0 * 1024.0) return fmt::format("{:.2f} MiB", b / (1024.0 * 1024.0));
  return fmt::format("{:.1f} KiB", b / 1024.0);
}

void print_table(const BenchServeFlags& f, const RunSetup& setup, const ServeResult& r, const Summary& s) {
  const EngineMetrics& m = r.metrics;
  std::printf("bench-serve: %s\n", f.model.c_str());
  std::printf(
      "%d requests, %d in flight; prompt %d tokens (first %d shared, %.2f), %d output tokens each, %s, "
      "seed %llu\n",
      f.requests, f.concurrency, f.prompt_tokens, setup.shared_tokens, f.shared_prefix, f.output_tokens,
      sampling_name(f).c_str(), static_cast<unsigned long long>(f.seed));
  const std::string kv = setup.k_type == setup.v_type ? setup.k_type : setup.k_type + "/" + setup.v_type;
  std::printf("KV %s, block size %d, pool %d blocks%s, max batch tokens %d, max seqs %d, threads %d\n\n", kv.c_str(),
              f.block_size, setup.pool_blocks, setup.pool_auto ? " (default)" : "", f.max_batch_tokens, setup.max_seqs,
              setup.threads);

  const uint64_t peak_bytes = static_cast<uint64_t>(m.peak_blocks_used) * m.bytes_per_block;
  const double hit_rate = ratio(static_cast<double>(m.prefix_hit_tokens), static_cast<double>(m.prefix_queries_tokens));
  const std::vector<std::pair<std::string, std::string>> rows = {
      {"requests completed", fmt::format("{} / {}", s.num_completed, f.requests)},
      {"requests errored", fmt::format("{}", r.errors.size())},
      {"wall time", fmt::format("{:.3f} s", r.wall_seconds)},
      {"requests/s", fmt::format("{:.2f}", ratio(s.num_completed, r.wall_seconds))},
      {"output tokens/s", fmt::format("{:.1f}", ratio(static_cast<double>(s.num_output_tokens), r.wall_seconds))},
      {"total tokens/s (prompt + output)",
       fmt::format("{:.1f}", ratio(static_cast<double>(s.num_prompt_tokens + s.num_output_tokens), r.wall_seconds))},
      {"time to first token p50", ms(percentile(s.ttft, 0.5))},
      {"time to first token p99", ms(percentile(s.ttft, 0.99))},
      {"time per output token p50", ms(percentile(s.tpot, 0.5))},
      {"time per output token p99", ms(percentile(s.tpot, 0.99))},
      {"prefix hit rate", fmt::format("{:.1f}% ({} of {} tokens looked up)", 100 * hit_rate, m.prefix_hit_tokens,
                                      m.prefix_queries_tokens)},
      {"prompt tokens cached at first admission",
       fmt::format(
           "{:.1f}% ({} of {})",
           100 * ratio(static_cast<double>(s.num_cached_prompt_tokens), static_cast<double>(s.num_prompt_tokens)),
           s.num_cached_prompt_tokens, s.num_prompt_tokens)},
      {"peak pool usage", fmt::format("{} of {} blocks ({:.1f}%), {} of {}", m.peak_blocks_used, m.blocks_total,
                                      100 * ratio(m.peak_blocks_used, m.blocks_total), human_bytes(peak_bytes),
                                      human_bytes(static_cast<uint64_t>(m.blocks_total) * m.bytes_per_block))},
      {"sliding-window layers' slots",
       m.local_slots_total == 0
           ? std::string("none (no such layers)")
           : fmt::format("{} at most pinned of {} ({} of {})", r.local_peak_pinned, m.local_slots_total,
                         human_bytes(static_cast<uint64_t>(r.local_peak_pinned) * m.local_bytes_per_slot),
                         human_bytes(static_cast<uint64_t>(m.local_slots_total) * m.local_bytes_per_slot))},
      {"preemptions", fmt::format("{}", m.preemptions)},
      {"blocks leaked at the end", fmt::format("{} ({} in use once idle)", r.blocks_leaked, r.blocks_used_at_end)},
  };
  size_t name_width = 6, value_width = 5;
  for (const auto& [name, value] : rows) {
    name_width = std::max(name_width, name.size());
    value_width = std::max(value_width, value.size());
  }
  std::printf("| %-*s | %-*s |\n", static_cast<int>(name_width), "metric", static_cast<int>(value_width), "value");
  std::printf("|%s|%s|\n", std::string(name_width + 2, '-').c_str(), std::string(value_width + 2, '-').c_str());
  for (const auto& [name, value] : rows) {
    std::printf("| %-*s | %-*s |\n", static_cast<int>(name_width), name.c_str(), static_cast<int>(value_width),
                value.c_str());
  }
  std::printf(
      "\ntime per output token: per request, the mean gap between its output tokens = (last - first token) "
      "/ (tokens - 1); percentiles over requests, linearly interpolated\n"
      "prefix hit rate: the engine's lookups, which count every admission attempt (a waiting request retried, a "
      "preempted one finding its own blocks); first admission: the shared prefix alone\n");
  for (const std::string& e : r.errors) std::printf("%s\n", e.c_str());
}

void run_bench_serve(const BenchServeFlags& f, const BenchServeFlagsGiven& given) {
  check_flags(f, given);
  const KvStorageOptions storage = f.kv.storage_options();
  RunSetup setup;
  setup.k_type = std::string(kv_type_name(f.kv.k_type()));
  setup.v_type = std::string(kv_type_name(f.kv.v_type()));
  setup.shared_tokens = static_cast<int>(std::lround(f.shared_prefix * f.prompt_tokens));
  setup.max_seqs = given.max_seqs ? f.max_seqs : f.concurrency;

  auto model = load_model_file(f.model);
  const ModelConfig& config = model->config();
  if (static_cast<int64_t>(f.prompt_tokens) + f.output_tokens > config.context_length) {
    throw CliError(fmt::format("--prompt-tokens {} + --output-tokens {} = {} exceeds the model's context of {}",
                               f.prompt_tokens, f.output_tokens,
                               static_cast<int64_t>(f.prompt_tokens) + f.output_tokens, config.context_length));
  }
  const auto prompts =
      make_prompts(f.requests, f.prompt_tokens, setup.shared_tokens, config.vocab_size, model->tokenizer(), f.seed);

  // The default pool: every in-flight request's whole sequence, plus the shared prefix, which
  // stays cached beside them.
  if (given.pool_blocks) {
    setup.pool_blocks = f.pool_blocks;
  } else if (f.block_size >= 1) {  // a bad --block-size is Engine::create's error, below
    const int64_t per_request = ceil_div(static_cast<int64_t>(f.prompt_tokens) + f.output_tokens, f.block_size);
    const int64_t blocks = per_request * f.concurrency + ceil_div(setup.shared_tokens, f.block_size);
    constexpr int64_t kMaxBlocks = int64_t{1} << 30;
    setup.pool_blocks = static_cast<int>(std::min(blocks, kMaxBlocks));
    setup.pool_auto = true;
  }
  setup.threads = resolve_threads(f.threads);

  EngineOptions options;
  options.k_type = f.kv.k_type();
  options.v_type = f.kv.v_type();
  options.storage = storage;
  options.block_size = f.block_size;
  options.num_blocks = setup.pool_blocks;
  options.max_batch_tokens = f.max_batch_tokens;
  options.max_seqs = setup.max_seqs;
  ThreadPool pool(setup.threads);
  auto engine = value_or_throw(Engine::create(*model, pool, options));
  for (const std::string& warning : engine->warnings()) std::fprintf(stderr, "warning: %s\n", warning.c_str());

  Progress progress(f.requests, !f.quiet && isatty(fileno(stderr)) == 1);
  const ServeResult r = serve(*engine, prompts, f, progress);
  const Summary s = summarize(r, f.output_tokens);

  if (f.json) {
    std::printf("%s\n", to_json(f, setup, r, s).dump(2).c_str());
  } else {
    print_table(f, setup, r, s);
  }
  if (r.blocks_leaked != 0 || r.blocks_used_at_end != 0 || r.local_pinned_at_end != 0) {
    throw CliError(fmt::format("the pool leaked: {} blocks not back, {} still in use, {} sliding-window slots still "
                               "pinned after every request finished",
                               r.blocks_leaked, r.blocks_used_at_end, r.local_pinned_at_end));
  }
  if (!r.errors.empty()) {
    throw CliError(
        fmt::format("{} of {} requests did not complete; first: {}", r.errors.size(), f.requests, r.errors.front()));
  }
  if (s.num_short != 0) {
    throw CliError(
        fmt::format("{} requests finished with fewer than --output-tokens {}", s.num_short, f.output_tokens));
  }
}

}  // namespace

CLI::App* add_bench_serve_command(CLI::App& app) {
  auto flags = std::make_shared<BenchServeFlags>();
  CLI::App* cmd = app.add_subcommand(
      "bench-serve",
      "Serve N synthetic requests, C at a time, through one engine: throughput, TTFT, time per output "
      "token, prefix hits, pool use");
  cmd->add_option("--model,-m", flags->model, "GGUF model file")->required();
  cmd->add_option("--requests", flags->requests, "requests to serve")->capture_default_str();
  cmd->add_option("--concurrency", flags->concurrency,
                  "requests in flight at once (the next is submitted as one "
                  "finishes)")
      ->capture_default_str();
  cmd->add_option("--prompt-tokens", flags->prompt_tokens, "random prompt tokens per request")->capture_default_str();
  cmd->add_option("--output-tokens", flags->output_tokens, "tokens generated per request (EOS ignored)")
      ->capture_default_str();
  cmd->add_option("--shared-prefix", flags->shared_prefix,
                  "fraction of each prompt, from its start, identical in every request (0..1)")
      ->capture_default_str();
  const CLI::Option* pool_blocks = cmd->add_option(
      "--pool-blocks", flags->pool_blocks,
      "KV blocks in the pool (default: ceil((P + O) / block size) per in-flight request, plus the shared prefix)");
  cmd->add_option("--block-size", flags->block_size, "tokens per KV block")->capture_default_str();
  cmd->add_option("--max-batch-tokens", flags->max_batch_tokens, "tokens per engine step (decodes + prompt chunks)")
      ->capture_default_str();
  const CLI::Option* max_seqs =
      cmd->add_option("--max-seqs", flags->max_seqs, "requests the engine runs at once (default: --concurrency)");
  flags->kv.add_to(cmd);
  cmd->add_option("--threads,-t", flags->threads, "threads (default: all cores)");
  cmd->add_option("--seed", flags->seed, "seed of the random prompts (request i samples with seed + 1 + i)")
      ->capture_default_str();
  cmd->add_option("--temp", flags->temperature, "sampling temperature of every request (<= 0: greedy)")
      ->capture_default_str();
  cmd->add_option("--top-k", flags->top_k, "top-k cut (<= 0: off)")->capture_default_str();
  cmd->add_option("--top-p", flags->top_p, "top-p cut (1: off)")->capture_default_str();
  cmd->add_option("--min-p", flags->min_p, "min-p cut (0: off)")->capture_default_str();
  cmd->add_flag("--json", flags->json, "print one JSON object with every number on stdout");
  cmd->add_flag("--quiet,-q", flags->quiet, "no progress line on stderr (shown only when stderr is a terminal)");
  cmd->callback([flags, pool_blocks, max_seqs] {
    run_bench_serve(*flags,
                    BenchServeFlagsGiven{.pool_blocks = pool_blocks->count() > 0, .max_seqs = max_seqs->count() > 0});
  });
  return cmd;
}

}  // namespace kvlm::cli
