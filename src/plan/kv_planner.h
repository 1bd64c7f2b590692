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
  // Whole blocks one sequence of `ctx` holds at its peak: ceil(peak_tokens / block_size), plus
  // evicted_slot_blocks(policy) once the sequence has evicted (ctx > budget).
  int64_t blocks_per_sequence(int64_t ctx, int block_size) const;
};

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
  // metadata does not divide evenly over its tokens).
  double bytes_per_token() const { return static_cast<double>(bytes_per_block) / block_size; }
};

// Bytes of `form` for `shape` with codecs k/v, computed through kv_codec(..).block_bytes.
Result<KvFootprint> kv_footprint(const ModelShape& shape, KvType k_type, KvType v_type, CacheForm form,
                                 int block_size);

// The reference every ratio is against: an FP16 multi-head cache with one K and one V per
// query head, 2 bytes per value: layers × num_heads × (head_dim + v_head_dim) × 2.
double mha_f16_bytes_per_token(const ModelShape& shape);

// The options kvlm supports for a shape, one per codec in all_kv_types() with K = V:
// the full cache for MHA/GQA models, the latent for MLA models; then, for each eviction in
// `evictions`, the same codecs under that policy and budget.
std::vector<KvOption> kv_options(const ModelShape& shape, std::span<const PlanEviction> evictions = {});

// What fits in memory beside the weights, for one option.
struct MemoryFit {
  uint64_t memory_bytes = 0;
  uint64_t weight_bytes = 0;
  uint64_t available_bytes = 0;  // memory − weights, 0 when the weights alone do not fit
  int64_t tokens = 0;            // whole blocks that fit × block_size (all sequences together)
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
};

struct PlanRow {
  KvOption option;
  bool is_baseline = false;      // the FP16 MHA reference row, not an option kvlm runs
  KvFootprint footprint;
  int64_t tokens_per_sequence = 0;  // resident tokens of one sequence of ctx
  double formula_bytes = 0;         // tokens_per_sequence × batch × bytes_per_token()
  uint64_t staging_bytes_per_sequence = 0;  // KIVI f32 staging (tail + residual blocks), else 0
  // Whole blocks one sequence holds at its peak (KvOption::blocks_per_sequence), and of those
  // the policy's extra ones: evicted slots not yet dropped, snapkv's uncompressed prompt step.
  int64_t blocks_per_sequence = 0;
  int64_t policy_extra_blocks = 0;
  // (blocks_per_sequence × bytes_per_block + staging_bytes_per_sequence) × batch
  uint64_t block_bytes_total = 0;
  double ratio_to_baseline = 0;     // bytes_per_token / mha_f16_bytes_per_token
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

// The memory fit of one footprint for sequences of `resident_tokens` (whole blocks, no eviction).
MemoryFit compute_fit(const KvFootprint& footprint, int64_t resident_tokens, uint64_t memory_bytes,
                      uint64_t weight_bytes, int kivi_residual_tokens = 0);
// The same for sequences of `blocks_per_sequence` blocks each (an evicting option's peak).
MemoryFit compute_fit_blocks(const KvFootprint& footprint, int64_t blocks_per_sequence, uint64_t memory_bytes,
                             uint64_t weight_bytes, int kivi_residual_tokens = 0);

// What a live pool holding these sequences should hold, for comparing with KvStorage /
// KvCacheManager numbers: a live pool allocates whole blocks, so
//   formula_bytes <= block_bytes <= formula_bytes + slack_bytes,
// slack_bytes being one partially filled block per sequence and layer.
struct PoolPrediction {
  double formula_bytes = 0;    // Σ tokens × bytes_per_token()
  uint64_t block_bytes = 0;    // Σ ceil(tokens / block_size) × bytes_per_block
  uint64_t slack_bytes = 0;    // num_sequences × bytes_per_block
  uint64_t staging_bytes = 0;  // KIVI: the most f32 staging these sequences hold (KvStorage::staging_bytes), else 0
  KvFootprint footprint;
};
// block_bytes compares with the blocks a KvCacheManager holds × KvStorage::bytes_per_block().
Result<PoolPrediction> predict_pool_bytes(const ModelShape& shape, KvType k_type, KvType v_type, CacheForm form,
                                          int block_size, std::span<const int64_t> tokens_per_sequence,
                                          int kivi_residual_tokens = 0);

// The shape a live KvStorage has (MHA/GQA, K and V the same head size), for predictions
// made from a layout: num_heads = num_kv_heads (the query head count is not in a layout,
// so only ratios against the baseline are affected).
ModelShape shape_from_kv_layout(const KvLayout& layout);

}  // namespace kvlm
