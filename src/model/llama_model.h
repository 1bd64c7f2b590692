// LlamaModel: a loaded llama-family model (config, weights, tokenizer) and its cached forward pass.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/ids.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "model/gated_ffn.h"
#include "model/llama_weights.h"
#include "model/mla_attention.h"
#include "model/mla_expanded.h"
#include "model/moe_ffn.h"
#include "model/model_config.h"
#include "model/tokenizer.h"

namespace kvlm {

class GgufFile;
class KvStorage;

// Which rows of logits a forward pass produces.
enum class LogitsRows {
  kLast,  // only the last new token's: [1, vocab]
  kAll,   // every new token's: [num_tokens, vocab]
};

// One forward step of one sequence: new tokens appended after the tokens already cached.
// Without eviction a token's slot in the cache and its position in the text are the same
// number. An evicting cache (evict/) separates them: slots are where K/V live in the block
// table (evicted slots may sit between the sinks and the window), positions are what RoPE
// rotates with. See docs/ARCHITECTURE.md, "Positions under eviction".
struct SequenceStep {
  std::span<const TokenId> tokens;      // [num_new]; token i goes to slot num_cached_tokens + i
  int num_cached_tokens = 0;            // slots already in this sequence's block table (live or evicted)
  std::span<const int32_t> block_table; // must already cover num_cached_tokens + num_new slots
  LogitsRows logits_rows = LogitsRows::kLast;

  // Token i's position in the text, which its query and key are rotated with; -1 = its slot.
  int64_t first_position = -1;
  // Attention sinks and window (PagedAttentionArgs): slots [0, num_sink_tokens) and
  // [window_begin, ...) are visible, the ones between are evicted. All of it is data the eviction
  // layer computes; the model applies it without knowing a policy. When
  // first_sink_query_position >= 0, each query is rotated a second time, at
  // first_sink_query_position + i (its position within the cache), to score the sinks.
  int num_sink_tokens = 0;
  int window_begin = 0;
  int64_t first_sink_query_position = -1;
  // When set, the attention weights the last num_weight_queries tokens of the step give each
  // slot, summed over those queries, all heads and all layers, are added here (H2O, SnapKV).
  float* slot_weights = nullptr;        // [num_cached_tokens + num_new]
  int num_weight_queries = 0;
  // Sliding-window layers: the first slot each new token's query sees there (its window, by
  // text position, over the slots). Empty: slots are positions, the window is the last
  // `window` slots. Needed once eviction made slots differ from positions.
  // On a storage that keeps only the windows (KvStorage local layers), the blocks the step
  // writes and reads there must be pinned (LocalWindowHold): the forward never pins or unpins.
  std::span<const int32_t> local_first_tokens{};  // [num_new] or empty
};

// What loading took: kvlm maps the file and uses its matrices in place, so on a cold page cache
// the time moves to the first forward, which faults the weights in.
struct ModelLoadStats {
  double seconds = 0;                  // map, validate, bind, build the tokenizer
  uint64_t file_bytes = 0;
  uint64_t resident_bytes_before = 0;  // of the file, in the page cache when loading began
  uint64_t copied_bytes = 0;           // held in kvlm's memory (LlamaWeights::copied_bytes, or all of an in-memory file)
  bool mapped = true;                  // false: loaded from bytes in memory (the embedded model)
};

class LlamaModel {
 public:
  // Maps the file, reads the config, binds the weights and builds the tokenizer.
  static Result<std::unique_ptr<LlamaModel>> load(const std::string& path);
  // The same from a GGUF file's bytes in memory (the model compiled into the binary); `name`
  // stands for the path in errors. The bytes are copied to aligned storage the model owns.
  static Result<std::unique_ptr<LlamaModel>> load_from_bytes(std::vector<uint8_t> bytes, std::string name);
  ~LlamaModel();

  const ModelConfig& config() const { return config_; }
  const LlamaWeights& weights() const { return weights_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const GgufFile& file() const { return *file_; }
  const ModelLoadStats& load_stats() const { return load_stats_; }

  // Runs the step: writes the new tokens' K/V into `cache` (layout must match the model) and
  // returns their logits in `logits` ([rows, vocab], resized). Not thread-safe: one step at a time.
  void forward(const SequenceStep& step, KvStorage& cache, ThreadPool& pool, std::vector<float>& logits);

  // One forward over the new tokens of several sequences (a batch): the matmuls run once over
  // all of them, so every weight is read once per step; RoPE, the K/V write and attention run
  // per sequence over its own block table, positions and visible ranges. `logits` gets each
  // step's rows in order (1 for kLast, its tokens for kAll): [sum of rows, vocab]. Sequences
  // must not share a block they write (the cache manager copies shared blocks first).
  void forward_batch(std::span<const SequenceStep> steps, KvStorage& cache, ThreadPool& pool,
                     std::vector<float>& logits);

  // deepseek2: attention absorbed (default) or expanded per head every step (mla_expanded.h; plain
  // causal attention only, for measurements and as a second computation in tests).
  void set_mla_mode(MlaMode mode) { mla_mode_ = mode; }
  MlaMode mla_mode() const { return mla_mode_; }

  // Count of K/V projections computed so far (one per token per forward): the cache's savings.
  uint64_t kv_projections_computed() const { return kv_projections_computed_; }

 private:
  LlamaModel() = default;
  // Reads the config, binds the weights and builds the tokenizer of an opened file.
  static Result<std::unique_ptr<LlamaModel>> from_file(std::unique_ptr<GgufFile> file);
  // The pieces of one layer of forward_batch, over its scratch buffers.
  void project_qkv(int layer, int64_t n, bool any_sink_queries, ThreadPool& pool);
  void attend(int layer, std::span<const SequenceStep> steps, int64_t att_stride, KvStorage& cache, ThreadPool& pool);
  void attend_expanded(int layer, std::span<const SequenceStep> steps, KvStorage& cache, ThreadPool& pool);

  std::unique_ptr<GgufFile> file_;
  ModelLoadStats load_stats_;
  ModelConfig config_;
  LlamaWeights weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
  uint64_t kv_projections_computed_ = 0;

  // Scratch reused across steps, sized for the largest step so far.
  std::vector<float> x_;        // [n, dim] residual stream
  std::vector<float> xn_;       // [n, dim] normalized
  std::vector<float> q_;        // [n, q_dim]
  std::vector<float> q_sink_;   // [n, q_dim] the queries rotated at their positions within the cache
  std::vector<float> k_;        // [n, kv_dim]; MLA: the cache rows
  std::vector<float> v_;        // [n, kv_dim]
  std::vector<float> att_;      // [n, q_dim]
  std::vector<float> proj_;     // [n, dim]
  GatedFfnScratch ffn_;
  MlaMode mla_mode_ = MlaMode::kAbsorbed;
  MlaScratch mla_;
  MlaExpandedScratch mla_expanded_;
  MoeScratch moe_;
  std::vector<std::vector<int32_t>> local_tables_;  // [steps] each block table as the local layers' slots
  std::vector<int64_t> positions_;       // [n] each token's text position (RoPE)
  std::vector<int64_t> sink_positions_;  // [n] its position within the cache, -1 = no second rotation
};

}  // namespace kvlm
