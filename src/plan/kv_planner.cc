#include "plan/kv_planner.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include <fmt/format.h>

#include "core/check.h"
#include "kv/kv_codec.h"

namespace kvlm {
namespace {

constexpr int64_t kMaxBatch = int64_t{1} << 20;
constexpr int kMaxBlockSize = 1 << 16;

// Blocks needed for `tokens` tokens.
uint64_t blocks_for(int64_t tokens, int block_size) {
  return (static_cast<uint64_t>(tokens) + static_cast<uint64_t>(block_size) - 1) / static_cast<uint64_t>(block_size);
}

// a × b, or an error when it does not fit 64 bits (absurd flag values, not a bug).
Result<uint64_t> checked_mul(uint64_t a, uint64_t b, std::string_view what) {
  const unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
  if (p > UINT64_MAX) return Status::errorf("{} does not fit 64 bits ({} × {})", what, a, b);
  return static_cast<uint64_t>(p);
}

Status validate_block_size(int block_size) {
  if (block_size <= 0 || block_size > kMaxBlockSize) {
    return Status::errorf("block size {} must be in [1, {}]", block_size, kMaxBlockSize);
  }
  return Status::ok_status();
}

constexpr std::string_view kPlanPolicies[] = {"window", "streaming", "h2o", "snapkv"};
constexpr int64_t kMaxBudget = int64_t{1} << 28;  // validate_eviction_options' bound
constexpr int64_t kMaxTokens = int64_t{1} << 31;  // the longest ctx and step make_plan accepts
// The most blocks max_global_blocks answers (a guard: products with block sizes stay in 64 bits).
constexpr int64_t kMaxAnswerBlocks = int64_t{1} << 31;

}  // namespace

std::string plan_policy_list() {
  std::string names;
  for (std::string_view p : kPlanPolicies) names += fmt::format("{}{}", names.empty() ? "" : ", ", p);
  return names;
}

Status validate_plan_eviction(const PlanEviction& e) {
  if (std::find(std::begin(kPlanPolicies), std::end(kPlanPolicies), e.policy) == std::end(kPlanPolicies)) {
    return Status::errorf("unknown eviction policy '{}' (choose {})", e.policy, plan_policy_list());
  }
  if (e.budget < 1 || e.budget > kMaxBudget) {
    return Status::errorf("--policy {} needs --budget in [1, {}] (got {})", e.policy, kMaxBudget, e.budget);
  }
  if (e.policy == "streaming" && (e.sinks < 0 || e.sinks >= e.budget)) {
    return Status::errorf("--sinks {} must be in [0, --budget {})", e.sinks, e.budget);
  }
  if (e.prompt_step_tokens < 0 || e.prompt_step_tokens > kMaxBudget) {
    return Status::errorf("snapkv prompt step {} must be in [0, {}]", e.prompt_step_tokens, kMaxBudget);
  }
  return Status::ok_status();
}

int evicted_slot_blocks(std::string_view policy) { return policy == "window" || policy == "streaming" ? 2 : 0; }

int64_t KvOption::peak_tokens(int64_t ctx) const {
  if (!evicts()) return ctx;
  if (policy == "snapkv") return std::min(ctx, token_budget + std::max(prompt_step_tokens, token_budget));
  return std::min(ctx, token_budget);
}

int64_t KvOption::blocks_per_sequence(int64_t ctx, int block_size) const {
  const int64_t blocks = static_cast<int64_t>(blocks_for(peak_tokens(ctx), block_size));
  // Nothing is evicted until the budget is passed, so no evicted slots linger before that.
  return evicts() && ctx > token_budget ? blocks + evicted_slot_blocks(policy) : blocks;
}

// Live tokens (window + step − 1) start anywhere in a block, hence the + 1.
int64_t local_layer_block_cap(int64_t step_tokens, int window, int block_size) {
  return static_cast<int64_t>(blocks_for(window + step_tokens - 1, block_size)) + 1;
}

int64_t local_layer_blocks(int64_t tokens, int64_t step_tokens, int window, int block_size) {
  KVLM_CHECK(tokens >= 0 && step_tokens >= 1 && window >= 1 && block_size >= 1,
             "local_layer_blocks(tokens {}, step {}, window {}, block size {})", tokens, step_tokens, window,
             block_size);
  const int64_t all = static_cast<int64_t>(blocks_for(tokens, block_size));
  if (tokens <= window + step_tokens - 1) return all;  // nothing has left the window yet
  return std::min(all, local_layer_block_cap(step_tokens, window, block_size));
}

Result<KvFootprint> kv_footprint(const ModelShape& shape, KvType k_type, KvType v_type, CacheForm form,
                                 int block_size) {
  KVLM_RETURN_IF_ERROR(validate_model_shape(shape));
  KVLM_RETURN_IF_ERROR(validate_block_size(block_size));
  KvFootprint f;
  f.block_size = block_size;
  if (form == CacheForm::kLatent) {
    if (!shape.is_mla()) return Status::errorf("model {} has no MLA latent (kv lora rank 0)", shape.name);
    // The latent is K-only: one "head" of kv_lora_rank + rope dims per layer and token.
    const KvLayout latent{shape.num_layers, 1, shape.latent_dim(), block_size};
    f.k_block_bytes = kv_codec(k_type, KvRole::kKey).block_bytes(latent);
    f.v_block_bytes = 0;
    if (is_kivi(k_type)) f.staging_bytes_per_block = latent.values_per_token() * block_size * sizeof(float);
  } else {
    const KvLayout k_layout{shape.num_layers, shape.num_kv_heads, shape.head_dim, block_size};
    const KvLayout v_layout{shape.num_layers, shape.num_kv_heads, shape.v_head_dim, block_size};
    f.k_block_bytes = kv_codec(k_type, KvRole::kKey).block_bytes(k_layout);
    f.v_block_bytes = kv_codec(v_type, KvRole::kValue).block_bytes(v_layout);
    if (is_kivi(k_type)) f.staging_bytes_per_block += k_layout.values_per_token() * block_size * sizeof(float);
    if (is_kivi(v_type)) f.staging_bytes_per_block += v_layout.values_per_token() * block_size * sizeof(float);
  }
  KVLM_ASSIGN_OR_RETURN(f.bytes_per_block, checked_mul(f.k_block_bytes + f.v_block_bytes,
                                                       static_cast<uint64_t>(shape.num_layers), "bytes per block"));
  f.staging_bytes_per_block *= static_cast<uint64_t>(shape.num_layers);
  return f;
}

double mha_f16_bytes_per_token(const ModelShape& shape) {
  return static_cast<double>(shape.num_layers) * shape.num_heads * (shape.head_dim + shape.v_head_dim) * 2.0;
}

double kv_bytes_for_context(const ModelShape& shape, const KvFootprint& footprint, int64_t tokens) {
  if (!shape.has_local_layers()) return footprint.bytes_per_token() * static_cast<double>(tokens);
  // One layer's block over its tokens, times the layer-tokens: integers until the one division.
  return static_cast<double>(footprint.layer_bytes_per_block()) * static_cast<double>(shape.layer_tokens(tokens)) /
         footprint.block_size;
}

SequenceBlocks sequence_blocks(const ModelShape& shape, const KvOption& option, int64_t ctx, int64_t step_tokens,
                               int block_size) {
  SequenceBlocks blocks;
  blocks.global = option.blocks_per_sequence(ctx, block_size);
  if (shape.has_local_layers()) {
    // A local layer needs the last window + step − 1 positions; eviction keeps slots in position
    // order, so they are the last slots, and never more than the global layers hold.
    blocks.local =
        std::min(blocks.global, local_layer_blocks(ctx, step_tokens, shape.sliding_window.window, block_size));
  }
  return blocks;
}

Result<uint64_t> sequence_block_bytes(const ModelShape& shape, const KvFootprint& footprint, SequenceBlocks blocks) {
  if (blocks.global < 0 || blocks.local < 0) {
    return Status::errorf("block counts {} (global) and {} (local) must be >= 0", blocks.global, blocks.local);
  }
  const unsigned __int128 layer_blocks =
      static_cast<unsigned __int128>(blocks.global) * static_cast<unsigned>(shape.num_global_layers()) +
      static_cast<unsigned __int128>(blocks.local) * static_cast<unsigned>(shape.num_local_layers());
  const unsigned __int128 bytes = layer_blocks * footprint.layer_bytes_per_block();
  if (bytes > UINT64_MAX) {
    return Status::errorf("bytes of a sequence of {} blocks per layer do not fit 64 bits", blocks.global);
  }
  return static_cast<uint64_t>(bytes);
}

int64_t max_global_blocks(const ModelShape& shape, const KvFootprint& footprint, uint64_t bytes,
                          int64_t local_block_cap) {
  const uint64_t layer_block = footprint.layer_bytes_per_block();
  if (layer_block == 0 || shape.num_layers <= 0) return 0;
  // In one-layer blocks: a sequence of g blocks per global layer costs n·g while g <= cap (every
  // layer grows), G·g + L·cap after (only the global layers grow).
  const uint64_t budget = bytes / layer_block;
  const uint64_t n = static_cast<uint64_t>(shape.num_layers);
  const uint64_t num_global = static_cast<uint64_t>(shape.num_global_layers());
  const uint64_t cap = shape.has_local_layers() ? static_cast<uint64_t>(std::max<int64_t>(local_block_cap, 0))
                                                : UINT64_MAX;
  uint64_t g = 0;
  if (budget / n <= cap) {
    g = budget / n;
  } else if (num_global == 0) {
    // Memory stops growing at the window: no limit; answer the longest context make_plan takes.
    return static_cast<int64_t>(blocks_for(kMaxTokens, footprint.block_size));
  } else {
    g = cap + (budget - n * cap) / num_global;  // n·cap < budget here: no overflow
  }
  return static_cast<int64_t>(std::min<uint64_t>(g, kMaxAnswerBlocks));
}

std::vector<KvOption> kv_options(const ModelShape& shape, std::span<const PlanEviction> evictions) {
  std::vector<KvOption> options;
  const CacheForm form = shape.is_mla() ? CacheForm::kLatent : CacheForm::kFull;
  for (KvType type : all_kv_types()) {
    KvOption o;
    o.label = std::string(kv_type_name(type)) + (shape.is_mla() ? " latent" : "");
    o.k_type = type;
    o.v_type = type;
    o.form = form;
    options.push_back(std::move(o));
  }
  const size_t num_full = options.size();
  for (const PlanEviction& e : evictions) {
    for (size_t i = 0; i < num_full; ++i) {
      KvOption o = options[i];
      o.label = fmt::format("{} + {} {}", o.label, e.policy, e.budget);
      o.policy = e.policy;
      o.token_budget = e.budget;
      o.sinks = e.policy == "streaming" ? e.sinks : 0;
      o.prompt_step_tokens = e.policy == "snapkv" ? e.prompt_step_tokens : 0;
      options.push_back(std::move(o));
    }
  }
  return options;
}

MemoryFit compute_fit(const ModelShape& shape, const KvFootprint& footprint, const FitQuery& query) {
  MemoryFit fit;
  fit.memory_bytes = query.memory_bytes;
  fit.weight_bytes = query.weight_bytes;
  fit.available_bytes = query.memory_bytes > query.weight_bytes ? query.memory_bytes - query.weight_bytes : 0;
  if (footprint.bytes_per_block == 0) return fit;
  const uint64_t staging = footprint.staging_bytes_per_sequence(query.kivi_residual_tokens);
  // Tokens: one sequence (one staging set) holding as many whole blocks as fit.
  const uint64_t for_blocks = fit.available_bytes > staging ? fit.available_bytes - staging : 0;
  fit.tokens = max_global_blocks(shape, footprint, for_blocks, query.local_block_cap) * footprint.block_size;
  // Saturates instead of wrapping: a sequence larger than 2^64 bytes fits zero times.
  const unsigned __int128 layer_blocks =
      static_cast<unsigned __int128>(std::max<int64_t>(query.blocks.global, 0)) *
          static_cast<unsigned>(shape.num_global_layers()) +
      static_cast<unsigned __int128>(std::max<int64_t>(query.blocks.local, 0)) *
          static_cast<unsigned>(shape.num_local_layers());
  const unsigned __int128 per_sequence = layer_blocks * footprint.layer_bytes_per_block() + staging;
  fit.sequences = per_sequence == 0 ? 0 : static_cast<int64_t>(fit.available_bytes / per_sequence);
  return fit;
}

Result<Plan> make_plan(const ModelShape& shape, const PlanRequest& request) {
  KVLM_RETURN_IF_ERROR(validate_model_shape(shape));
  KVLM_RETURN_IF_ERROR(validate_block_size(request.block_size));
  if (request.ctx <= 0 || request.ctx > (int64_t{1} << 31)) {
    return Status::errorf("ctx {} must be in [1, 2^31]", request.ctx);
  }
  if (request.kivi_residual_tokens < 0 || request.kivi_residual_tokens > (1 << 20)) {
    return Status::errorf("KIVI residual window {} must be in [0, 2^20] tokens", request.kivi_residual_tokens);
  }
  if (request.batch <= 0 || request.batch > kMaxBatch) {
    return Status::errorf("batch {} must be in [1, {}]", request.batch, kMaxBatch);
  }
  if (request.step_tokens < 1 || request.step_tokens > kMaxTokens) {
    return Status::errorf("step tokens {} must be in [1, 2^31]", request.step_tokens);
  }
  Plan plan;
  plan.shape = shape;
  plan.request = request;
  plan.baseline_bytes_per_token = mha_f16_bytes_per_token(shape);

  // The baseline: the FP16 cache the model would need with one K/V head per query head.
  ModelShape mha = shape;
  mha.num_kv_heads = shape.num_heads;
  mha.sliding_window = SlidingWindowConfig{};  // every layer global: the reference saves nothing
  KvOption baseline;
  baseline.label = "f16 MHA (reference)";
  baseline.k_type = KvType::kF16;
  baseline.v_type = KvType::kF16;

  std::vector<std::pair<KvOption, bool>> options{{baseline, true}};
  for (const PlanEviction& e : request.evictions) KVLM_RETURN_IF_ERROR(validate_plan_eviction(e));
  for (KvOption& o : kv_options(shape, request.evictions)) options.emplace_back(std::move(o), false);

  for (auto& [option, is_baseline] : options) {
    const ModelShape& row_shape = is_baseline ? mha : shape;
    PlanRow row;
    KVLM_ASSIGN_OR_RETURN(row.footprint, kv_footprint(row_shape, option.k_type, option.v_type, option.form,
                                                      request.block_size));
    row.option = std::move(option);
    row.is_baseline = is_baseline;
    row.tokens_per_sequence = row.option.resident_tokens(request.ctx);
    row.formula_bytes = kv_bytes_for_context(row_shape, row.footprint, row.tokens_per_sequence) *
                        static_cast<double>(request.batch);
    // kept_fraction is exactly 1 without local layers: then this is bytes_per_token() itself.
    row.bytes_per_token_at_ctx = row.footprint.bytes_per_token() * row_shape.kept_fraction(row.tokens_per_sequence);
    const SequenceBlocks blocks =
        sequence_blocks(row_shape, row.option, request.ctx, request.step_tokens, request.block_size);
    row.blocks_per_sequence = blocks.global;
    row.local_blocks_per_sequence = blocks.local;
    row.policy_extra_blocks =
        row.blocks_per_sequence - static_cast<int64_t>(blocks_for(row.tokens_per_sequence, request.block_size));
    KVLM_ASSIGN_OR_RETURN(const uint64_t arena_per_sequence, sequence_block_bytes(row_shape, row.footprint, blocks));
    row.staging_bytes_per_sequence = row.footprint.staging_bytes_per_sequence(request.kivi_residual_tokens);
    const uint64_t per_sequence = arena_per_sequence + row.staging_bytes_per_sequence;
    KVLM_ASSIGN_OR_RETURN(row.block_bytes_total,
                          checked_mul(per_sequence, static_cast<uint64_t>(request.batch), "total bytes"));
    row.ratio_to_baseline = row.footprint.bytes_per_token() / plan.baseline_bytes_per_token;
    row.ratio_at_ctx = row.bytes_per_token_at_ctx / plan.baseline_bytes_per_token;
    if (request.memory_bytes) {
      FitQuery query;
      query.memory_bytes = *request.memory_bytes;
      query.weight_bytes = request.weight_bytes;
      query.blocks = blocks;
      query.kivi_residual_tokens = request.kivi_residual_tokens;
      if (row_shape.has_local_layers()) {
        query.local_block_cap =
            local_layer_block_cap(request.step_tokens, row_shape.sliding_window.window, request.block_size);
      }
      row.fit = compute_fit(row_shape, row.footprint, query);
    }
    plan.rows.push_back(std::move(row));
  }
  return plan;
}

Result<PoolPrediction> predict_pool_bytes(const ModelShape& shape, const PoolQuery& query) {
  PoolPrediction p;
  KVLM_ASSIGN_OR_RETURN(p.footprint, kv_footprint(shape, query.k_type, query.v_type, query.form, query.block_size));
  const bool windowed = query.local_blocks == LocalLayerBlocks::kWindow && shape.has_local_layers();
  const int block_size = query.block_size;
  const uint64_t layer_block = p.footprint.layer_bytes_per_block();
  const double layer_token_bytes = static_cast<double>(layer_block) / block_size;
  for (const PoolSequence& seq : query.sequences) {
    if (seq.tokens < 0) return Status::errorf("sequence length {} must be >= 0", seq.tokens);
    if (seq.last_step_tokens < 1 || seq.last_step_tokens > kMaxTokens) {
      return Status::errorf("last step of {} tokens must be in [1, 2^31]", seq.last_step_tokens);
    }
    SequenceBlocks blocks;
    blocks.global = static_cast<int64_t>(blocks_for(seq.tokens, block_size));
    // Without the window, local layers are priced as global ones.
    blocks.local = windowed ? local_layer_blocks(seq.tokens, seq.last_step_tokens, shape.sliding_window.window,
                                                 block_size)
                            : blocks.global;
    KVLM_ASSIGN_OR_RETURN(const uint64_t bytes, sequence_block_bytes(shape, p.footprint, blocks));
    p.block_bytes += bytes;
    if (windowed) {
      p.formula_bytes += kv_bytes_for_context(shape, p.footprint, seq.tokens);
      // One partial block per global layer; a local layer may hold up to its whole-block bound.
      const double local_formula = layer_token_bytes * static_cast<double>(shape.local_layer_tokens(seq.tokens));
      const double local_slack = static_cast<double>(blocks.local) * static_cast<double>(layer_block) - local_formula;
      p.slack_bytes += layer_block * static_cast<uint64_t>(shape.num_global_layers()) +
                       static_cast<uint64_t>(shape.num_local_layers()) * static_cast<uint64_t>(std::ceil(local_slack));
    } else {
      p.formula_bytes += static_cast<double>(seq.tokens) * p.footprint.bytes_per_token();
      p.slack_bytes += p.footprint.bytes_per_block;
    }
  }
  p.staging_bytes = p.footprint.staging_bytes_per_sequence(query.kivi_residual_tokens) * query.sequences.size();
  return p;
}

Result<PoolPrediction> predict_pool_bytes(const ModelShape& shape, KvType k_type, KvType v_type, CacheForm form,
                                          int block_size, std::span<const int64_t> tokens_per_sequence,
                                          int kivi_residual_tokens) {
  PoolQuery query;
  query.k_type = k_type;
  query.v_type = v_type;
  query.form = form;
  query.block_size = block_size;
  query.kivi_residual_tokens = kivi_residual_tokens;
  query.local_blocks = LocalLayerBlocks::kEveryToken;
  for (int64_t tokens : tokens_per_sequence) query.sequences.push_back(PoolSequence{tokens, 1});
  return predict_pool_bytes(shape, query);
}

ModelShape shape_from_kv_layout(const KvLayout& layout) {
  ModelShape s;
  s.name = "kv layout";
  s.architecture = "llama";
  s.num_layers = layout.num_layers;
  s.num_heads = layout.num_kv_heads;
  s.num_kv_heads = layout.num_kv_heads;
  s.head_dim = layout.head_dim;
  s.v_head_dim = layout.head_dim;
  s.context_length = 1;
  return s;
}

}  // namespace kvlm
