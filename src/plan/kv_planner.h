// The KV planner: bytes per token, totals and memory fit for every KV option kvlm supports.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
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

// One way to hold the cache. Every number comes from the codecs themselves
// (kv_codec(type, role).block_bytes), so codecs added to kv/ appear with their exact bytes.
//
// Extension point for eviction policies (window, StreamingLLM, H2O, ...): an option with
// token_budget > 0 holds min(ctx, budget) tokens per sequence. kv_options() lists only what
// kvlm implements; a policy's issue adds its rows there.
struct KvOption {
  std::string label;         // "f16", "f16 latent"
  KvType k_type = KvType::kF16;
  KvType v_type = KvType::kF16;  // ignored for kLatent
  CacheForm form = CacheForm::kFull;
  std::string policy = "full";   // eviction policy name; "full" keeps every token
  int64_t token_budget = 0;      // 0: no eviction

  bool evicts() const { return token_budget > 0; }
  // Tokens one sequence of `ctx` tokens keeps resident.
  int64_t resident_tokens(int64_t ctx) const { return evicts() ? std::min(ctx, token_budget) : ctx; }
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
// the full cache for MHA/GQA models, the latent for MLA models.
std::vector<KvOption> kv_options(const ModelShape& shape);

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
};

struct PlanRow {
  KvOption option;
  bool is_baseline = false;      // the FP16 MHA reference row, not an option kvlm runs
  KvFootprint footprint;
  int64_t tokens_per_sequence = 0;  // resident tokens of one sequence of ctx
  double formula_bytes = 0;         // tokens_per_sequence × batch × bytes_per_token()
  uint64_t staging_bytes_per_sequence = 0;  // KIVI f32 staging (tail + residual blocks), else 0
  // (ceil(tokens_per_sequence / block_size) × bytes_per_block + staging_bytes_per_sequence) × batch
  uint64_t block_bytes_total = 0;
  double ratio_to_baseline = 0;     // bytes_per_token / mha_f16_bytes_per_token
  std::optional<MemoryFit> fit;
};

struct Plan {
  ModelShape shape;
  PlanRequest request;
  double baseline_bytes_per_token = 0;
  std::vector<PlanRow> rows;  // the baseline row first, then kv_options(shape)
};

// Validates the shape and the request (ctx, batch, block size > 0) and fills every row.
Result<Plan> make_plan(const ModelShape& shape, const PlanRequest& request);

// The memory fit of one footprint for sequences of `resident_tokens`.
MemoryFit compute_fit(const KvFootprint& footprint, int64_t resident_tokens, uint64_t memory_bytes,
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
