#include "eval/speed_bench.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>
#include <span>
#include <string_view>

#include <fmt/format.h>

#include "cache/kv_cache_manager.h"
#include "core/check.h"
#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "engine/release_sequence.h"
#include "eval/sample_stats.h"
#include "gguf/gguf_file.h"
#include "kv/kv_storage.h"
#include "model/llama_model.h"

namespace kvlm {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxBlockSize = 4096;
constexpr int kMaxPrefillChunk = 65536;

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    size_t begin = colon + 1;
    while (begin < line.size() && line[begin] == ' ') ++begin;
    return line.substr(begin);
  }
  return "unknown CPU";
}

std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

// "293K", "124M", "1.5B": the short size label llama-bench puts in its model column.
std::string short_count(uint64_t n) {
  const double x = static_cast<double>(n);
  if (x >= 1e9) return fmt::format("{:.1f}B", x / 1e9);
  if (x >= 1e6) return fmt::format("{:.0f}M", x / 1e6);
  if (x >= 1e3) return fmt::format("{:.0f}K", x / 1e3);
  return fmt::format("{}", n);
}

// The fixed token ids of one run: the depth fill (a prefix of `fill` for each depth), the pp prompt
// and the tg inputs. Drawn once, so every repetition and every depth does identical work.
struct BenchTokens {
  std::vector<TokenId> fill;  // [max_depth]
  std::vector<TokenId> prompt;  // [prompt_tokens]
  std::vector<TokenId> gen;   // [gen_tokens]
};

BenchTokens draw_tokens(const SpeedBenchOptions& options, int max_depth, int vocab) {
  Rng rng(options.seed);
  auto draw = [&](int count) {
    std::vector<TokenId> ids(static_cast<size_t>(count));
    for (TokenId& id : ids) id = static_cast<TokenId>(rng.next_u64() % static_cast<uint64_t>(vocab));
    return ids;
  };
  BenchTokens t;
  t.fill = draw(max_depth);
  t.prompt = draw(options.prompt_tokens);
  t.gen = draw(options.gen_tokens);
  return t;
}

// Drives one sequence whose blocks were reserved for depth + max(p, n) tokens. The manager counts
// only the `depth` filled tokens; timed work writes slots at positions >= depth without appending,
// so the next repetition overwrites them and sees exactly the filled prefix again. This rewinds
// without a truncate in the cache manager: slots below `depth`, including those sharing the
// partial block at the boundary, are never written after the fill.
class BenchSequence {
 public:
  BenchSequence(LlamaModel& model, KvStorage& storage, ThreadPool& pool, std::span<const int32_t> table,
                int prefill_chunk)
      : model_(model), storage_(storage), pool_(pool), table_(table), prefill_chunk_(prefill_chunk) {}

  // Forwards `tokens` at positions [start, start + size) in chunks of prefill_chunk.
  void prefill(std::span<const TokenId> tokens, int start) {
    for (size_t done = 0; done < tokens.size();) {
      const size_t n = std::min(tokens.size() - done, static_cast<size_t>(prefill_chunk_));
      model_.forward(SequenceStep{tokens.subspan(done, n), start + static_cast<int>(done), table_, LogitsRows::kLast},
                     storage_, pool_, logits_);
      done += n;
    }
  }

  // One token per forward at positions [start, start + size).
  void decode(std::span<const TokenId> tokens, int start) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      model_.forward(SequenceStep{tokens.subspan(i, 1), start + static_cast<int>(i), table_, LogitsRows::kLast},
                     storage_, pool_, logits_);
    }
  }

 private:
  LlamaModel& model_;
  KvStorage& storage_;
  ThreadPool& pool_;
  std::span<const int32_t> table_;
  int prefill_chunk_;
  std::vector<float> logits_;  // [1, vocab], discarded
};

// Writes `depth` tokens of random K/V (uniform in [-2, 2)) into every layer, sealed as a forward
// would seal them (KIVI encodes the blocks outside the residual window).
void fill_random_kv(KvStorage& storage, std::span<const int32_t> table, int depth, uint64_t seed) {
  const KvLayout& layout = storage.layout();
  Rng rng(seed ^ 0x6b766c6d66696c6cULL);
  std::vector<float> k(layout.values_per_token()), v(layout.values_per_token());  // [num_kv_heads, head_dim]
  for (int layer = 0; layer < layout.num_layers; ++layer) {
    for (int pos = 0; pos < depth; ++pos) {
      for (float& x : k) x = static_cast<float>(4 * rng.next_double() - 2);
      for (float& x : v) x = static_cast<float>(4 * rng.next_double() - 2);
      storage.write_tokens(layer, table, pos, 1, k.data(), layout.is_latent() ? nullptr : v.data());  // MLA: rows only
    }
  }
}

template <typename Fn>
double seconds_of(Fn&& fn) {
  const auto start = Clock::now();
  fn();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

SpeedBenchRow make_row(const SpeedBenchOptions& options, const SpeedBenchCodec& codec, SpeedTest test, int tokens,
                       int depth) {
  SpeedBenchRow row;
  row.test = speed_test_name(test, tokens, depth);
  (test == SpeedTest::kPrompt ? row.prompt_tokens : row.gen_tokens) = tokens;
  row.depth = depth;
  row.k_type = codec.k_type;
  row.v_type = codec.v_type;
  row.reps = options.reps;
  return row;
}

void finish_row(SpeedBenchRow& row, int tokens) {
  for (double s : row.samples_s) row.samples_tps.push_back(static_cast<double>(tokens) / s);
  row.mean_tps = mean_of(row.samples_tps);
  row.stddev_tps = stddev_of(row.samples_tps);
  row.median_tps = median_of(row.samples_tps);
}

// One codec's cache for the whole run: its storage and block manager.
struct CodecCache {
  std::unique_ptr<KvStorage> storage;
  std::unique_ptr<KvCacheManager> cache;
};

}  // namespace

std::string speed_test_name(SpeedTest test, int tokens, int depth) {
  const std::string base = fmt::format("{}{}", test == SpeedTest::kPrompt ? "pp" : "tg", tokens);
  return depth > 0 ? fmt::format("{} @ d{}", base, depth) : base;
}

std::string format_bytes_binary(uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.2f} MiB", b / (1024.0 * 1024));
  if (b >= 1024.0) return fmt::format("{:.2f} KiB", b / 1024.0);
  return fmt::format("{} B", bytes);
}

std::string format_count_si(uint64_t count) {
  const double c = static_cast<double>(count);
  if (c >= 1e9) return fmt::format("{:.2f} B", c / 1e9);
  if (c >= 1e6) return fmt::format("{:.2f} M", c / 1e6);
  if (c >= 1e3) return fmt::format("{:.2f} K", c / 1e3);
  return fmt::format("{}", count);
}

uint64_t decode_weight_read_bytes(const LlamaWeights& weights) {
  return weights.decode_weight_bytes() + weights.token_embd.row_bytes;
}

Status validate_speed_bench_options(const SpeedBenchOptions& o, const ModelConfig& config) {
  if (o.prompt_tokens < 0) return Status::errorf("-p {} must be >= 0 (0 skips prompt processing)", o.prompt_tokens);
  if (o.gen_tokens < 0) return Status::errorf("-n {} must be >= 0 (0 skips generation)", o.gen_tokens);
  if (o.prompt_tokens == 0 && o.gen_tokens == 0) return Status::error("nothing to measure: -p and -n are both 0");
  if (o.depths.empty()) return Status::error("no depth given: -d needs at least one value, e.g. -d 0");
  if (static_cast<int>(o.depths.size()) > SpeedBenchOptions::kMaxDepths) {
    return Status::errorf("-d lists {} depths; at most {} are allowed", o.depths.size(), SpeedBenchOptions::kMaxDepths);
  }
  for (int d : o.depths) {
    if (d < 0) return Status::errorf("-d {} must be >= 0", d);
  }
  if (o.codecs.empty() || static_cast<int>(o.codecs.size()) > SpeedBenchOptions::kMaxCodecs) {
    return Status::errorf("{} KV codecs given; between 1 and {} are allowed", o.codecs.size(),
                          SpeedBenchOptions::kMaxCodecs);
  }
  if (o.reps < 1 || o.reps > SpeedBenchOptions::kMaxReps) {
    return Status::errorf("-r/--reps {} must be in [1, {}]", o.reps, SpeedBenchOptions::kMaxReps);
  }
  if (o.block_size < 1 || o.block_size > kMaxBlockSize) {
    return Status::errorf("--block-size {} must be in [1, {}]", o.block_size, kMaxBlockSize);
  }
  if (o.prefill_chunk < 1 || o.prefill_chunk > kMaxPrefillChunk) {
    return Status::errorf("prefill chunk {} must be in [1, {}]", o.prefill_chunk, kMaxPrefillChunk);
  }
  const int max_depth = *std::max_element(o.depths.begin(), o.depths.end());
  const int64_t total = static_cast<int64_t>(max_depth) + o.prompt_tokens + o.gen_tokens;
  if (total > config.context_length) {
    return Status::errorf("depth {} + -p {} + -n {} = {} tokens exceeds the model's context of {} tokens", max_depth,
                          o.prompt_tokens, o.gen_tokens, total, config.context_length);
  }
  return Status::ok_status();
}

Result<SpeedBenchResult> run_speed_bench(LlamaModel& model, ThreadPool& pool, const SpeedBenchOptions& options) {
  const ModelConfig& config = model.config();
  KVLM_RETURN_IF_ERROR(validate_speed_bench_options(options, config));

  const int max_depth = *std::max_element(options.depths.begin(), options.depths.end());
  const int span = std::max(options.prompt_tokens, options.gen_tokens);
  const int block_size = options.block_size;
  const int num_blocks = (max_depth + span + block_size - 1) / block_size;
  const KvLayout layout = config.kv_layout(block_size);
  std::vector<CodecCache> caches;  // [codecs]
  for (const SpeedBenchCodec& codec : options.codecs) {
    CodecCache c;
    KVLM_ASSIGN_OR_RETURN(c.storage, KvStorage::create(layout, codec.k_type, codec.v_type, num_blocks, codec.storage));
    c.cache = std::make_unique<KvCacheManager>(num_blocks, block_size);
    caches.push_back(std::move(c));
  }

  SpeedBenchResult result;
  for (const GgufTensorInfo& t : model.file().tensors()) {
    result.model_bytes += t.num_bytes;
    result.num_params += static_cast<uint64_t>(t.num_elements());
  }
  const LlamaWeights& weights = model.weights();
  KVLM_CHECK(!weights.layers.empty(), "model has no layers");
  result.model_label = fmt::format("{} {} {}", config.architecture, short_count(result.num_params),
                                   upper(ggml_type_name(weights.layers[0].wq.type)));
  result.threads = pool.num_threads();
  const std::string features = cpu_features().summary();
  result.machine = fmt::format("CPU: {}; kernel features: {}; threads: {} of {} hardware", cpu_model_name(),
                               features.empty() ? "none (portable kernels)" : features, pool.num_threads(),
                               ThreadPool::default_num_threads());
  result.block_size = block_size;
  result.seed = options.seed;
  result.weight_bytes_per_token = decode_weight_read_bytes(weights);

  const BenchTokens tokens = draw_tokens(options, max_depth, config.vocab_size);
  const std::span<const TokenId> prompt(tokens.prompt);
  const std::span<const TokenId> gen(tokens.gen);
  const size_t num_codecs = options.codecs.size();
  for (int depth : options.depths) {
    // Every codec's sequence filled to `depth`, each in its own cache.
    std::vector<SeqId> seqs;
    std::vector<std::vector<int32_t>> tables;  // [codecs][blocks for depth + span]
    std::vector<std::unique_ptr<BenchSequence>> runners;
    for (CodecCache& c : caches) {
      const SeqId seq = c.cache->create_sequence();
      KVLM_CHECK(c.cache->reserve(seq, depth + span), "pool of {} blocks cannot hold depth {} + {} tokens", num_blocks,
                 depth, span);
      seqs.push_back(seq);
      tables.push_back(c.cache->table(seq).block_ids());
    }
    for (size_t i = 0; i < num_codecs; ++i) {
      runners.push_back(
          std::make_unique<BenchSequence>(model, *caches[i].storage, pool, tables[i], options.prefill_chunk));
      if (options.fill == SpeedBenchOptions::DepthFill::kModel) {
        runners[i]->prefill(std::span<const TokenId>(tokens.fill).first(static_cast<size_t>(depth)), 0);
      } else {
        fill_random_kv(*caches[i].storage, tables[i], depth, options.seed);
      }
      caches[i].cache->append(seqs[i], depth);
    }

    // One test for every codec: warm-ups first, then the repetitions interleaved across codecs.
    auto run_test = [&](SpeedTest test, int num_tokens, auto&& warmup, auto&& timed) {
      std::vector<SpeedBenchRow> rows;
      for (const SpeedBenchCodec& codec : options.codecs) rows.push_back(make_row(options, codec, test, num_tokens, depth));
      if (options.warmup) {
        for (size_t i = 0; i < num_codecs; ++i) warmup(*runners[i]);
      }
      for (int r = 0; r < options.reps; ++r) {
        for (size_t i = 0; i < num_codecs; ++i) rows[i].samples_s.push_back(seconds_of([&] { timed(*runners[i]); }));
      }
      for (size_t i = 0; i < num_codecs; ++i) {
        SpeedBenchRow& row = rows[i];
        finish_row(row, num_tokens);
        row.kv_bytes_per_cached_token = caches[i].storage->bytes_per_token();
        if (test == SpeedTest::kGeneration) {
          // Step i (0-based) attends over depth + i + 1 tokens, its own included: the mean over n
          // steps is depth + (n + 1) / 2.
          row.weight_bytes_per_token = static_cast<double>(result.weight_bytes_per_token);
          row.kv_tokens_read = static_cast<double>(depth) + (static_cast<double>(num_tokens) + 1.0) / 2.0;
          row.kv_bytes_per_token = row.kv_tokens_read * static_cast<double>(row.kv_bytes_per_cached_token);
          const SlidingWindowConfig& sw = config.sliding_window;
          if (sw.any()) {
            // A local layer reads at most its window: sum each layer's mean over the n steps.
            double layer_tokens = 0;
            for (int step = 0; step < num_tokens; ++step) {
              const double context = static_cast<double>(depth) + step + 1;
              const double local = std::min(context, static_cast<double>(sw.window));
              layer_tokens += (config.num_layers - sw.num_local_layers()) * context + sw.num_local_layers() * local;
            }
            row.kv_bytes_per_token = layer_tokens / num_tokens * static_cast<double>(row.kv_bytes_per_cached_token) /
                                     config.num_layers;
          }
          row.bytes_per_token = row.weight_bytes_per_token + row.kv_bytes_per_token;
          row.gb_per_s = row.bytes_per_token * row.mean_tps / 1e9;
        }
        result.rows.push_back(std::move(row));
      }
    };
    if (options.prompt_tokens > 0) {
      run_test(
          SpeedTest::kPrompt, options.prompt_tokens,
          // Warm-up with the largest step shape: touches every weight and sizes the forward's scratch.
          [&](BenchSequence& s) {
            s.prefill(prompt.first(std::min<size_t>(prompt.size(), static_cast<size_t>(options.prefill_chunk))), depth);
          },
          [&](BenchSequence& s) { s.prefill(prompt, depth); });
    }
    if (options.gen_tokens > 0) {
      run_test(
          SpeedTest::kGeneration, options.gen_tokens, [&](BenchSequence& s) { s.decode(gen.first(1), depth); },
          [&](BenchSequence& s) { s.decode(gen, depth); });
    }
    for (size_t i = 0; i < num_codecs; ++i) {
      KVLM_CHECK(caches[i].cache->table(seqs[i]).num_tokens() == depth, "sequence holds {} tokens after the tests, filled {}",
                 caches[i].cache->table(seqs[i]).num_tokens(), depth);
      release_sequence(*caches[i].cache, *caches[i].storage, seqs[i]);
    }
  }
  for (const CodecCache& c : caches) result.blocks_in_use_at_end += c.cache->num_used_blocks();
  return result;
}

void apply_bandwidth_probe(SpeedBenchResult& result, double bandwidth_gb_s, double read_bandwidth_gb_s) {
  result.bandwidth_gb_s = bandwidth_gb_s;
  result.read_bandwidth_gb_s = read_bandwidth_gb_s;
  for (SpeedBenchRow& row : result.rows) {
    row.bandwidth_share = row.is_generation() && bandwidth_gb_s > 0 ? row.gb_per_s / bandwidth_gb_s : 0.0;
    row.read_bandwidth_share =
        row.is_generation() && read_bandwidth_gb_s > 0 ? row.gb_per_s / read_bandwidth_gb_s : 0.0;
  }
}

std::string format_speed_bench_table(const SpeedBenchResult& result) {
  struct Column {
    std::string header;
    bool right = false;  // numbers are right-aligned, as in llama-bench
  };
  const std::vector<Column> columns = {{"model"},   {"size", true}, {"params", true}, {"backend"},
                                       {"threads", true}, {"type_k"}, {"type_v"}, {"test", true},
                                       {"t/s", true}, {"MB/tok", true}, {"GB/s", true}, {"% BW", true},
                                       {"% read", true}};
  std::vector<std::vector<std::string>> cells;  // [rows, columns]
  for (const SpeedBenchRow& row : result.rows) {
    cells.push_back({result.model_label, format_bytes_binary(result.model_bytes), format_count_si(result.num_params),
                     result.backend, fmt::format("{}", result.threads), std::string(kv_type_name(row.k_type)),
                     std::string(kv_type_name(row.v_type)), row.test,
                     fmt::format("{:.2f} ± {:.2f}", row.mean_tps, row.stddev_tps),
                     row.is_generation() ? fmt::format("{:.2f}", row.bytes_per_token / 1e6) : std::string(),
                     row.is_generation() ? fmt::format("{:.2f}", row.gb_per_s) : std::string(),
                     row.bandwidth_share > 0 ? fmt::format("{:.0f}%", 100 * row.bandwidth_share) : std::string(),
                     row.read_bandwidth_share > 0 ? fmt::format("{:.0f}%", 100 * row.read_bandwidth_share)
                                                  : std::string()});
  }
  // Widths count code points, so "±" takes one column like every other character.
  auto width = [](const std::string& s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  };
  std::vector<size_t> widths(columns.size());
  for (size_t c = 0; c < columns.size(); ++c) {
    widths[c] = std::max<size_t>(width(columns[c].header), 3);
    for (const auto& r : cells) widths[c] = std::max(widths[c], width(r[c]));
  }
  auto pad = [&](const std::string& s, size_t c) {
    const std::string fill(widths[c] - width(s), ' ');
    return columns[c].right ? fill + s : s + fill;
  };
  std::string out = "|";
  for (size_t c = 0; c < columns.size(); ++c) out += " " + pad(columns[c].header, c) + " |";
  out += "\n|";
  for (size_t c = 0; c < columns.size(); ++c) {
    out += " " + std::string(widths[c] - (columns[c].right ? 1 : 0), '-') + (columns[c].right ? ":" : "") + " |";
  }
  out += "\n";
  for (const auto& r : cells) {
    out += "|";
    for (size_t c = 0; c < columns.size(); ++c) out += " " + pad(r[c], c) + " |";
    out += "\n";
  }
  return out;
}

}  // namespace kvlm
