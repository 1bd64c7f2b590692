#include "plan/kv_planner.h"

#include <algorithm>
#include <iterator>

#include <fmt/format.h>

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

MemoryFit compute_fit(const KvFootprint& footprint, int64_t resident_tokens, uint64_t memory_bytes,
                      uint64_t weight_bytes, int kivi_residual_tokens) {
  const int64_t blocks =
      footprint.block_size > 0 ? static_cast<int64_t>(blocks_for(resident_tokens, footprint.block_size)) : 0;
  return compute_fit_blocks(footprint, blocks, memory_bytes, weight_bytes, kivi_residual_tokens);
}

MemoryFit compute_fit_blocks(const KvFootprint& footprint, int64_t blocks_per_sequence, uint64_t memory_bytes,
                             uint64_t weight_bytes, int kivi_residual_tokens) {
  MemoryFit fit;
  fit.memory_bytes = memory_bytes;
  fit.weight_bytes = weight_bytes;
  fit.available_bytes = memory_bytes > weight_bytes ? memory_bytes - weight_bytes : 0;
  if (footprint.bytes_per_block == 0) return fit;
  const uint64_t staging = footprint.staging_bytes_per_sequence(kivi_residual_tokens);
  // Tokens: one sequence (one staging set) holding as many whole blocks as fit.
  const uint64_t for_blocks = fit.available_bytes > staging ? fit.available_bytes - staging : 0;
  fit.tokens = static_cast<int64_t>(for_blocks / footprint.bytes_per_block) * footprint.block_size;
  // Saturates instead of wrapping: a sequence larger than 2^64 bytes fits zero times.
  const unsigned __int128 per_sequence =
      static_cast<unsigned __int128>(blocks_per_sequence) * footprint.bytes_per_block + staging;
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
  Plan plan;
  plan.shape = shape;
  plan.request = request;
  plan.baseline_bytes_per_token = mha_f16_bytes_per_token(shape);

  // The baseline: the FP16 cache the model would need with one K/V head per query head.
  ModelShape mha = shape;
  mha.num_kv_heads = shape.num_heads;
  KvOption baseline;
  baseline.label = "f16 MHA (reference)";
  baseline.k_type = KvType::kF16;
  baseline.v_type = KvType::kF16;

  std::vector<std::pair<KvOption, bool>> options{{baseline, true}};
  for (const PlanEviction& e : request.evictions) KVLM_RETURN_IF_ERROR(validate_plan_eviction(e));
  for (KvOption& o : kv_options(shape, request.evictions)) options.emplace_back(std::move(o), false);

  for (auto& [option, is_baseline] : options) {
    PlanRow row;
    KVLM_ASSIGN_OR_RETURN(row.footprint, kv_footprint(is_baseline ? mha : shape, option.k_type, option.v_type,
                                                      option.form, request.block_size));
    row.option = std::move(option);
    row.is_baseline = is_baseline;
    row.tokens_per_sequence = row.option.resident_tokens(request.ctx);
    row.formula_bytes = row.footprint.bytes_per_token() * static_cast<double>(row.tokens_per_sequence) *
                        static_cast<double>(request.batch);
    row.blocks_per_sequence = row.option.blocks_per_sequence(request.ctx, request.block_size);
    row.policy_extra_blocks =
        row.blocks_per_sequence - static_cast<int64_t>(blocks_for(row.tokens_per_sequence, request.block_size));
    KVLM_ASSIGN_OR_RETURN(const uint64_t arena_per_sequence,
                          checked_mul(static_cast<uint64_t>(row.blocks_per_sequence), row.footprint.bytes_per_block,
                                      "bytes per sequence"));
    row.staging_bytes_per_sequence = row.footprint.staging_bytes_per_sequence(request.kivi_residual_tokens);
    const uint64_t per_sequence = arena_per_sequence + row.staging_bytes_per_sequence;
    KVLM_ASSIGN_OR_RETURN(row.block_bytes_total,
                          checked_mul(per_sequence, static_cast<uint64_t>(request.batch), "total bytes"));
    row.ratio_to_baseline = row.footprint.bytes_per_token() / plan.baseline_bytes_per_token;
    if (request.memory_bytes) {
      row.fit = compute_fit_blocks(row.footprint, row.blocks_per_sequence, *request.memory_bytes,
                                   request.weight_bytes, request.kivi_residual_tokens);
    }
    plan.rows.push_back(std::move(row));
  }
  return plan;
}

Result<PoolPrediction> predict_pool_bytes(const ModelShape& shape, KvType k_type, KvType v_type, CacheForm form,
                                          int block_size, std::span<const int64_t> tokens_per_sequence,
                                          int kivi_residual_tokens) {
  PoolPrediction p;
  KVLM_ASSIGN_OR_RETURN(p.footprint, kv_footprint(shape, k_type, v_type, form, block_size));
  for (int64_t tokens : tokens_per_sequence) {
    if (tokens < 0) return Status::errorf("sequence length {} must be >= 0", tokens);
    p.formula_bytes += static_cast<double>(tokens) * p.footprint.bytes_per_token();
    KVLM_ASSIGN_OR_RETURN(const uint64_t bytes,
                          checked_mul(blocks_for(tokens, block_size), p.footprint.bytes_per_block, "pool bytes"));
    p.block_bytes += bytes;
  }
  p.staging_bytes = p.footprint.staging_bytes_per_sequence(kivi_residual_tokens) * tokens_per_sequence.size();
  KVLM_ASSIGN_OR_RETURN(p.slack_bytes, checked_mul(tokens_per_sequence.size(), p.footprint.bytes_per_block,
                                                   "slack bytes"));
  return p;
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
