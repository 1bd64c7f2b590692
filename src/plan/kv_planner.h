// The KV planner: bytes per token, totals and memory fit for every KV option kvlm supports.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "kv/kv_layout.h"
#include "kv/kv_type.h"
#include "plan/model_shape.h"

namespace kvlm {

// What one layer stores per token.
enum class CacheForm {
  kFull,    // K and V per kv head: [num_kv_heads, head_dim] + [num_kv_heads, v_head_dim]
  kLatent,  // MLA: one latent [kv_lora_rank + rope_head_dim], K-only, shared by all heads
};

// Token eviction as the planner counts it: the policy names and the knobs of EvictionOptions
// (src/evict/eviction_options.h) that change bytes. plan does not link kvlm_evict, so the
// block rule lives in evicted_slot_blocks() below, checked against EvictingSequence by tests/plan.
struct PlanEviction {
  std::string policy;            // "window", "streaming", "h2o" or "snapkv" (eviction_policy_name)
  int64_t budget = 0;            // tokens attention sees, new tokens included
  int sinks = 4;                 // streaming: the first tokens, always kept
  // snapkv: the longest prompt step; it runs whole on top of the compressed cache before it is
  // compressed. 0: the budget (as EvictingSequence::max_blocks assumes, max(step, budget)).
  int64_t prompt_step_tokens = 0;
};

// The policy names a PlanEviction accepts, "window, streaming, h2o, snapkv".
std::string plan_policy_list();
// Errors name the flag: an unknown policy, budget < 1, sinks outside [0, budget) for streaming.
Status validate_plan_eviction(const PlanEviction& eviction);

// Blocks a sequence may hold beyond those its live tokens fill, once it has evicted: evicted
// slots not yet dropped. Must equal EvictingSequence::evicted_slot_blocks (src/evict/evicting_sequence.h;
// asserted in tests/plan/kv_planner_test.cc): window and streaming leave evicted slots in at most
// two blocks (the sinks' last block and the window's first) until a whole block is evicted and
// dropped; h2o and snapkv compact their survivors, so 0.
int evicted_slot_blocks(std::string_view policy);

// One way to hold the cache. Every number comes from the codecs themselves
// (kv_codec(type, role).block_bytes), so codecs added to kv/ appear with their exact bytes.
// An option with token_budget > 0 evicts: it holds min(ctx, budget) tokens per sequence.
struct KvOption {
  std::string label;         // "f16", "f16 latent", "int8 + streaming 4096"
  KvType k_type = KvType::kF16;
  KvType v_type = KvType::kF16;  // ignored for kLatent
  CacheForm form = CacheForm::kFull;
  std::string policy = "full";   // eviction policy name; "full" keeps every token
  int64_t token_budget = 0;      // 0: no eviction
  int sinks = 0;                 // streaming only
  int64_t prompt_step_tokens = 0;  // snapkv only: see PlanEviction

  bool evicts() const { return token_budget > 0; }
  // Tokens one sequence of `ctx` tokens keeps resident.
  int64_t resident_tokens(int64_t ctx) const { return evicts() ? std::min(ctx, token_budget) : ctx; }
  // Tokens one sequence of `ctx` holds at its peak: the resident ones, and for snapkv the prompt
  // step that runs whole on top of the budget before compression.
  int64_t peak_tokens(int64_t ctx) const;
  // Whole blocks one sequence of `ctx` holds at its peak in each global layer:
  // ceil(peak_tokens / block_size), plus evicted_slot_blocks(policy) once the sequence has
  // evicted (ctx > budget). Local layers: sequence_blocks().
  int64_t blocks_per_sequence(int64_t ctx, int block_size) const;
};

// Whole blocks a local layer of `window` tokens holds at most when a step of `step_tokens` ends
// a sequence of `tokens`. The step's first query sees the window − 1 tokens before it, so
// live = min(tokens, window + step − 1) tokens must stay; blocks wholly before them are returned.
// Until tokens exceed window + step − 1 nothing is returned: ceil(tokens / block_size); after
// that ceil(live / block_size) + 1 (the oldest live token may sit anywhere in its block), never
// more than ceil(tokens / block_size). Decode steps are 1 token.
int64_t local_layer_blocks(int64_t tokens, int64_t step_tokens, int window, int block_size);
// The most blocks local_layer_blocks gives however long the sequence: ceil((window + step − 1) /
// block_size) + 1.
int64_t local_layer_block_cap(int64_t step_tokens, int window, int block_size);

// Exact bytes of one option for one shape and block size.
struct KvFootprint {
  int block_size = 0;
  uint64_t k_block_bytes = 0;    // one layer, one block, K (or the MLA latent)
  uint64_t v_block_bytes = 0;    // one layer, one block, V (0 for the latent)
  uint64_t bytes_per_block = 0;  // all layers, K + V: what one block id costs
  // KIVI only: f32 bytes of one staged block over all layers and KIVI roles. KvStorage keeps a
  // sequence's tail block and its residual window staged in f32 until they are sealed.
  uint64_t staging_bytes_per_block = 0;

  // The most staging one sequence holds: (ceil(residual / block_size) + 1) staged blocks.
  uint64_t staging_bytes_per_sequence(int kivi_residual_tokens) const {
    if (staging_bytes_per_block == 0) return 0;
    const uint64_t residual_blocks = (static_cast<uint64_t>(kivi_residual_tokens) + block_size - 1) / block_size;
    return (residual_blocks + 1) * staging_bytes_per_block;
  }

  // The formula value: bytes_per_block / block_size (fractional for codecs whose block
  // metadata does not divide evenly over its tokens). Every layer's token: the full cache's
  // figure; a model with local layers stores less per token at long context (kv_bytes_for_context).
  double bytes_per_token() const { return static_cast<double>(bytes_per_block) / block_size; }
  // One layer's block, K + V: bytes_per_block / layers.
  uint64_t layer_bytes_per_block() const { return k_block_bytes + v_block_bytes; }
};

// Bytes of `form` for `shape` with codecs k/v, computed through kv_codec(..).block_bytes.
Result<KvFootprint> kv_footprint(const ModelShape& shape, KvType k_type, KvType v_type, CacheForm form,
                                 int block_size);

// The reference every ratio is against: an FP16 multi-head cache with one K and one V per
// query head in every layer, 2 bytes per value: layers × num_heads × (head_dim + v_head_dim) × 2.
// It has no local layers: ratios at a context show what GQA/MLA and the window save together.
double mha_f16_bytes_per_token(const ModelShape& shape);

// The formula bytes of one sequence of `tokens` tokens in `footprint` (computed for `shape`):
// global layers hold every token, local layers min(tokens, window), i.e.
// bytes_per_token() × shape.layer_tokens(tokens) / layers; bytes_per_token() × tokens without
// local layers.
double kv_bytes_for_context(const ModelShape& shape, const KvFootprint& footprint, int64_t tokens);

// Whole blocks one sequence holds per layer of each kind.
struct SequenceBlocks {
  int64_t global = 0;  // in each global layer
  int64_t local = 0;   // in each local layer; 0 when the shape has none
};
// The blocks of one sequence of `ctx` tokens under `option` whose steps are at most
// `step_tokens`: global layers option.blocks_per_sequence; local layers local_layer_blocks()
// (of the positions, which eviction cannot make more), at most the global count.
SequenceBlocks sequence_blocks(const ModelShape& shape, const KvOption& option, int64_t ctx, int64_t step_tokens,
                               int block_size);
// Their bytes: (global × global layers + local × local layers) × layer_bytes_per_block; an
// error past 64 bits.
Result<uint64_t> sequence_block_bytes(const ModelShape& shape, const KvFootprint& footprint, SequenceBlocks blocks);
// The most blocks per global layer one sequence can hold in `bytes`, its local layers holding
// min(that, local_block_cap) each; at most 2^31. Every layer local: once the local blocks fit
// there is no limit, and the answer is the blocks of 2^31 tokens, the longest ctx make_plan takes.
int64_t max_global_blocks(const ModelShape& shape, const KvFootprint& footprint, uint64_t bytes,
                          int64_t local_block_cap);

// The options kvlm supports for a shape, one per codec in all_kv_types() with K = V:
// the full cache for MHA/GQA models, the latent for MLA models; then, for each eviction in
// `evictions`, the same codecs under that policy and budget.
std::vector<KvOption> kv_options(const ModelShape& shape, std::span<const PlanEviction> evictions = {});

// What fits in memory beside the weights, for one option.
struct MemoryFit {
  uint64_t memory_bytes = 0;
  uint64_t weight_bytes = 0;
  uint64_t available_bytes = 0;  // memory − weights, 0 when the weights alone do not fit
  // The longest single sequence that fits, whole blocks: all of the memory for one sequence
  // without local layers; with them, local layers stop growing at their window, so much longer.
  int64_t tokens = 0;
  int64_t sequences = 0;         // sequences of ctx (resident) tokens that fit, whole blocks each
};

struct PlanRequest {
  int64_t ctx = 0;       // tokens per sequence
  int64_t batch = 1;     // concurrent sequences
  int block_size = 16;   // tokens per block
  std::optional<uint64_t> memory_bytes;  // fit is computed when set
  uint64_t weight_bytes = 0;             // subtracted from memory_bytes
  int kivi_residual_tokens = 0;          // KIVI options: KvStorageOptions::kivi_residual_tokens
  std::vector<PlanEviction> evictions;   // rows for each codec under these policies, beside the full cache
  // Local layers: the longest step (a prompt chunk) a sequence runs; during it a local layer
  // holds window + step − 1 tokens. 1: decode.
  int64_t step_tokens = 1;
};

struct PlanRow {
  KvOption option;
  bool is_baseline = false;      // the FP16 MHA reference row, not an option kvlm runs
  KvFootprint footprint;
  int64_t tokens_per_sequence = 0;  // resident tokens of one sequence of ctx
  // kv_bytes_for_context(tokens_per_sequence) × batch: local layers hold min(tokens, window)
  double formula_bytes = 0;
  // formula_bytes per sequence / tokens_per_sequence: footprint.bytes_per_token() without
  // local layers, less with them (the figure at this context, not the full cache's)
  double bytes_per_token_at_ctx = 0;
  uint64_t staging_bytes_per_sequence = 0;  // KIVI f32 staging (tail + residual blocks), else 0
  // Whole blocks one sequence holds at its peak in each global layer
  // (KvOption::blocks_per_sequence), and of those the policy's extra ones: evicted slots not
  // yet dropped, snapkv's uncompressed prompt step.
  int64_t blocks_per_sequence = 0;
  int64_t policy_extra_blocks = 0;
  int64_t local_blocks_per_sequence = 0;  // in each local layer (sequence_blocks); 0 without
  // (sequence_block_bytes + staging_bytes_per_sequence) × batch
  uint64_t block_bytes_total = 0;
  double ratio_to_baseline = 0;     // bytes_per_token / mha_f16_bytes_per_token: the full cache
  double ratio_at_ctx = 0;          // bytes_per_token_at_ctx / mha_f16_bytes_per_token
  std::optional<MemoryFit> fit;
};

struct Plan {
  ModelShape shape;
  PlanRequest request;
  double baseline_bytes_per_token = 0;
  std::vector<PlanRow> rows;  // the baseline row first, then kv_options(shape, request.evictions)
};

// Validates the shape and the request (ctx, batch, block size > 0) and fills every row.
Result<Plan> make_plan(const ModelShape& shape, const PlanRequest& request);

// What compute_fit weighs: memory, weights, and what one sequence holds.
struct FitQuery {
  uint64_t memory_bytes = 0;
  uint64_t weight_bytes = 0;     // subtracted from memory_bytes
  SequenceBlocks blocks;         // one sequence of the plan (sequence_blocks)
  // The most blocks a local layer holds however long a sequence grows (local_layer_blocks of
  // an unbounded sequence); bounds MemoryFit::tokens. 0 without local layers.
  int64_t local_block_cap = 0;
  int kivi_residual_tokens = 0;  // one staging set per sequence
};
// The memory fit of one footprint computed for `shape`.
MemoryFit compute_fit(const ModelShape& shape, const KvFootprint& footprint, const FitQuery& query);

// What a live pool holding these sequences should hold, for comparing with KvStorage /
// KvCacheManager numbers: a live pool allocates whole blocks, so
//   formula_bytes <= block_bytes <= formula_bytes + slack_bytes,
// slack_bytes being one partially filled block per sequence and layer (and, for a pool that
// returns local layers' old blocks, what local_layer_blocks allows beyond the window's tokens).
struct PoolPrediction {
  double formula_bytes = 0;    // Σ tokens × bytes_per_token()
  uint64_t block_bytes = 0;    // Σ ceil(tokens / block_size) × bytes_per_block
  uint64_t slack_bytes = 0;    // num_sequences × bytes_per_block
  uint64_t staging_bytes = 0;  // KIVI: the most f32 staging these sequences hold (KvStorage::staging_bytes), else 0
  KvFootprint footprint;
};
// How the pool holds a local layer's tokens.
enum class LocalLayerBlocks {
  kEveryToken,  // every layer keeps every token's block (a pool that returns none of them)
  kWindow,      // a local layer returns the blocks wholly before its window (local_layer_blocks)
};
struct PoolSequence {
  int64_t tokens = 0;            // tokens the sequence holds
  int64_t last_step_tokens = 1;  // tokens of its last step (decode: 1; a prompt chunk: more)
};
struct PoolQuery {
  KvType k_type = KvType::kF16;
  KvType v_type = KvType::kF16;
  CacheForm form = CacheForm::kFull;
  int block_size = 16;
  int kivi_residual_tokens = 0;
  LocalLayerBlocks local_blocks = LocalLayerBlocks::kWindow;
  std::vector<PoolSequence> sequences;
};
// block_bytes compares with the bytes of the blocks a KvCacheManager holds in every layer.
// kWindow: formula_bytes counts min(tokens, window) tokens in local layers and block_bytes
// local_layer_blocks(tokens, last_step_tokens) blocks in each; slack_bytes is one block per
// global layer plus, per local layer, what those blocks hold beyond the formula.
Result<PoolPrediction> predict_pool_bytes(const ModelShape& shape, const PoolQuery& query);
// Every layer keeping every token (LocalLayerBlocks::kEveryToken, whatever the shape's window):
// block_bytes compares with the blocks a KvCacheManager holds × KvStorage::bytes_per_block().
Result<PoolPrediction> predict_pool_bytes(const ModelShape& shape, KvType k_type, KvType v_type, CacheForm form,
                                          int block_size, std::span<const int64_t> tokens_per_sequence,
                                          int kivi_residual_tokens = 0);

// The shape a live KvStorage has (MHA/GQA, K and V the same head size), for predictions
// made from a layout: num_heads = num_kv_heads (the query head count is not in a layout,
// so only ratios against the baseline are affected).
ModelShape shape_from_kv_layout(const KvLayout& layout);

}  // namespace kvlm
