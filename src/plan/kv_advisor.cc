#include "plan/kv_advisor.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "kv/kv_codec.h"
#include "plan/memory_size.h"

namespace kvlm {
namespace {

struct ScenarioName {
  Scenario scenario;
  std::string_view name;
};
constexpr ScenarioName kScenarios[] = {
    {Scenario::kLimitedMemory, "limited-memory"},
    {Scenario::kLongChat, "long-chat"},
    {Scenario::kLongRecall, "long-recall"},
    {Scenario::kConcurrency, "concurrency"},
};

// The worse of the two codecs of an option (the latent uses only K).
CodecQuality row_quality(const PlanRow& row) {
  const CodecQuality k = codec_quality(row.option.k_type);
  if (row.option.form == CacheForm::kLatent) return k;
  const CodecQuality v = codec_quality(row.option.v_type);
  if (k.tier != v.tier) return k.tier > v.tier ? k : v;
  return k.relative_rms_error >= v.relative_rms_error ? k : v;
}

// Which rows a scenario considers: the full cache, the evicting options, or both.
enum class RowKind { kFull, kEvicting, kAny };

bool is_kind(const PlanRow& row, RowKind kind) {
  if (row.is_baseline) return false;
  switch (kind) {
    case RowKind::kFull:
      return !row.option.evicts();
    case RowKind::kEvicting:
      return row.option.evicts();
    case RowKind::kAny:
      return true;
  }
  return false;
}

// Indices of the plan's options of `kind`, best quality first, then fewest bytes per block, then
// per sequence (a smaller budget):
// the order in which every scenario considers them. The baseline row is a reference, never a candidate.
std::vector<size_t> candidates(const Plan& plan, RowKind kind) {
  std::vector<size_t> out;
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    if (is_kind(plan.rows[i], kind)) out.push_back(i);
  }
  // f32 ranks with the 16-bit codecs: K and V come from 16-bit (or coarser) weights, and a
  // 16-bit cache is llama.cpp's and vLLM's default, so 32 bits never win on quality alone.
  auto rank = [&](size_t i) { return std::max(row_quality(plan.rows[i]).tier, QualityTier::kLossless); };
  std::stable_sort(out.begin(), out.end(), [&](size_t a, size_t b) {
    const QualityTier ta = rank(a), tb = rank(b);
    if (ta != tb) return ta < tb;
    const PlanRow& ra = plan.rows[a];
    const PlanRow& rb = plan.rows[b];
    if (ra.footprint.bytes_per_block != rb.footprint.bytes_per_block) {
      return ra.footprint.bytes_per_block < rb.footprint.bytes_per_block;
    }
    if (ra.block_bytes_total != rb.block_bytes_total) return ra.block_bytes_total < rb.block_bytes_total;
    return row_quality(plan.rows[a]).relative_rms_error < row_quality(plan.rows[b]).relative_rms_error;
  });
  return out;
}

// Only the streaming rows of `order`.
std::vector<size_t> streaming_only(const Plan& plan, const std::vector<size_t>& order) {
  std::vector<size_t> out;
  for (size_t i : order) {
    if (plan.rows[i].option.policy == "streaming") out.push_back(i);
  }
  return out;
}

// Fewer bytes per block, then per sequence.
bool smaller(const PlanRow& x, const PlanRow& y) {
  if (x.footprint.bytes_per_block != y.footprint.bytes_per_block) {
    return x.footprint.bytes_per_block < y.footprint.bytes_per_block;
  }
  return x.block_bytes_total < y.block_bytes_total;
}

// The smallest option among `order` (not empty).
size_t smallest_row(const Plan& plan, const std::vector<size_t>& order) {
  return *std::min_element(order.begin(), order.end(),
                           [&](size_t x, size_t y) { return smaller(plan.rows[x], plan.rows[y]); });
}

bool fits(const Plan& plan, const PlanRow& row) {
  return !row.fit || row.fit->sequences >= plan.request.batch;
}

std::optional<size_t> first_fitting(const Plan& plan, const std::vector<size_t>& order) {
  for (size_t i : order) {
    if (fits(plan, plan.rows[i])) return i;
  }
  return std::nullopt;
}

bool within_bar(const PlanRow& row) { return row_quality(row).tier <= QualityTier::kNearLossless; }

// The smallest option of `order` that stores 8 bits or more (the quality bar), ties to the
// smaller measured error (order is sorted that way).
std::optional<size_t> smallest_within_bar(const Plan& plan, const std::vector<size_t>& order) {
  std::optional<size_t> best;
  for (size_t i : order) {
    if (!within_bar(plan.rows[i])) continue;
    if (!best || smaller(plan.rows[i], plan.rows[*best])) best = i;
  }
  return best;
}

std::string flags_for(const PlanRow& row) {
  const std::string_view k = kv_type_name(row.option.k_type), v = kv_type_name(row.option.v_type);
  std::string flags = row.option.form == CacheForm::kLatent || k == v
                          ? fmt::format("--kv-type {}", k)
                          : fmt::format("--kv-type-k {} --kv-type-v {}", k, v);
  if (row.option.evicts()) {
    flags += fmt::format(" --policy {} --budget {}", row.option.policy, row.option.token_budget);
    if (row.option.policy == "streaming") flags += fmt::format(" --sinks {}", row.option.sinks);
  }
  return flags;
}

// "/token" for a model without local layers; with them, the figure at this context and the full cache's.
std::string per_token(const Plan& plan, const PlanRow& row) {
  if (!plan.shape.has_local_layers()) return format_bytes(row.footprint.bytes_per_token()) + "/token";
  return fmt::format("{}/token at {} tokens ({}/token without the sliding window)",
                     format_bytes(row.bytes_per_token_at_ctx), row.tokens_per_sequence,
                     format_bytes(row.footprint.bytes_per_token()));
}

// What one more token adds to a full cache of `tokens`: past the window, only the global layers grow.
double growth_per_token(const Plan& plan, const PlanRow& row, int64_t tokens) {
  const ModelShape& s = plan.shape;
  if (!s.has_local_layers() || tokens < s.sliding_window.window) return row.footprint.bytes_per_token();
  return row.footprint.bytes_per_token() * s.num_global_layers() / s.num_layers;
}

// "f16 (lossless, 16.0 bits/value): 512.00 KiB/token, 2.00 GiB for 4096 tokens × 1 sequence, 1.00× the FP16 MHA cache"
std::string describe(const Plan& plan, const PlanRow& row) {
  const CodecQuality q = row_quality(row);
  std::string text = fmt::format(
      "{} ({}, {:.2f} bits/value, {:.2g}% rms error on a test block): {}, {} for {} {}tokens × {} sequence{}, "
      "{:.3f}× the FP16 MHA cache per token",
      row.option.label, quality_tier_name(q.tier), q.bits_per_value, 100 * q.relative_rms_error, per_token(plan, row),
      format_bytes(static_cast<double>(row.block_bytes_total)), row.tokens_per_sequence,
      row.option.evicts() ? "resident " : "", plan.request.batch, plan.request.batch == 1 ? "" : "s",
      row.ratio_at_ctx);
  if (row.policy_extra_blocks > 0) {
    text += fmt::format(" ({} blocks per sequence, {} of them for {})", row.blocks_per_sequence,
                        row.policy_extra_blocks,
                        row.option.policy == "snapkv" ? "the prompt step run before compression"
                                                      : "evicted slots not yet dropped");
  }
  return text;
}

std::string describe_fit(const PlanRow& row) {
  const MemoryFit& f = *row.fit;
  return fmt::format("{} leaves {} for the cache after {} of weights: {} fits {} tokens, {} sequence{} of {} {}tokens",
                     format_bytes(static_cast<double>(f.memory_bytes)), format_bytes(static_cast<double>(f.available_bytes)),
                     format_bytes(static_cast<double>(f.weight_bytes)), row.option.label, f.tokens, f.sequences,
                     f.sequences == 1 ? "" : "s", row.tokens_per_sequence, row.option.evicts() ? "resident " : "");
}

// What exists in this build at or above a tier, for "not available" notes.
bool has_tier(const Plan& plan, QualityTier tier) {
  for (const PlanRow& row : plan.rows) {
    if (!row.is_baseline && row_quality(row).tier == tier) return true;
  }
  return false;
}

void note_missing_quantized_codecs(const Plan& plan, Advice& advice) {
  if (!has_tier(plan, QualityTier::kNearLossless)) {
    advice.not_available.push_back(fmt::format(
        "8-bit KV codecs (int8 per token, fp8: ≈ lossless at half of f16) are not in this build (codecs: {})",
        kv_type_list()));
  }
  if (!has_tier(plan, QualityTier::kFourBit)) {
    advice.not_available.push_back("4-bit KV codecs (int4 per group) are not in this build");
  }
  if (!has_tier(plan, QualityTier::kTwoBit)) {
    advice.not_available.push_back("2-bit KIVI (keys per channel, values per token) is not in this build");
  }
}

// Architecture guidance for readers still choosing a model: what GQA or MLA does to this cache.
std::string architecture_note(const Plan& plan) {
  const ModelShape& s = plan.shape;
  if (s.is_mla()) {
    return fmt::format("MLA: each layer stores one latent of {} values ({} + {} rope dims) per token instead of "
                       "{} × ({} + {}) = {} K/V values: {:.1f}× less than the MHA cache at equal precision",
                       s.latent_dim(), s.kv_lora_rank, s.rope_head_dim, s.num_heads, s.head_dim, s.v_head_dim,
                       s.num_heads * (s.head_dim + s.v_head_dim),
                       static_cast<double>(s.num_heads * (s.head_dim + s.v_head_dim)) / s.latent_dim());
  }
  if (s.num_kv_heads < s.num_heads) {
    return fmt::format("GQA: this model stores {} K/V heads for {} query heads, {:.0f}× less than MHA", s.num_kv_heads,
                       s.num_heads, static_cast<double>(s.num_heads) / s.num_kv_heads);
  }
  const int gqa_heads = std::max(1, s.num_heads / 4);
  return fmt::format("this model is MHA ({} K/V heads); when choosing a model, GQA with {} K/V heads would need "
                     "{}/token in f16 ({}× less), and MLA with a 512+64 latent {}/token",
                     s.num_heads, gqa_heads,
                     format_bytes(2.0 * s.num_layers * gqa_heads * (s.head_dim + s.v_head_dim)),
                     s.num_heads / gqa_heads, format_bytes(2.0 * s.num_layers * 576));
}

// Gemma 3-style local layers: what the model's own window already saves, which every option has.
std::string sliding_window_note(const Plan& plan) {
  const ModelShape& s = plan.shape;
  return fmt::format("{} of {} layers are local (sliding window of {} tokens): they keep only the last {} tokens, "
                     "so at {} tokens a cache holds {:.0f}% of what it would with every layer global; the {} "
                     "global layers keep every token",
                     s.num_local_layers(), s.num_layers, s.sliding_window.window, s.sliding_window.window,
                     plan.request.ctx, 100 * s.kept_fraction(plan.request.ctx), s.num_global_layers());
}

// Why an evicting option was taken although it forgets tokens.
std::string eviction_tradeoff(const PlanRow& row) {
  return fmt::format("{} forgets every token outside its budget of {}: the model can no longer quote them, so it "
                     "comes only after quantization (which blurs tokens but keeps them all)",
                     row.option.label, row.option.token_budget);
}

void advise_limited_memory(const Plan& plan, Advice& a) {
  const std::vector<size_t> order = candidates(plan, RowKind::kFull);
  const PlanRow& best = plan.rows[order.front()];
  a.chosen_row = first_fitting(plan, order);
  if (a.chosen_row == order.front()) {
    a.reasons.push_back(fmt::format("the least lossy option already fits, so there is no need to quantize: {}",
                                    describe(plan, best)));
  } else {
    a.reasons.push_back(fmt::format("{} does not fit: {}", best.option.label, describe_fit(best)));
    a.reasons.push_back(
        "quantizing the cache is the safest first step for an existing model: no retraining, 8-bit KV is ≈ lossless, "
        "4-bit is next, and KIVI reaches 2 bits with keys quantized per channel");
    note_missing_quantized_codecs(plan, a);
  }
  if (!a.chosen_row) {
    // No full cache fits: a codec with a token budget keeps memory flat per sequence.
    const std::vector<size_t> evicting = candidates(plan, RowKind::kEvicting);
    a.chosen_row = first_fitting(plan, evicting);
    const PlanRow& smallest = plan.rows[smallest_row(plan, order)];
    a.reasons.push_back(fmt::format("no full cache fits, not even the smallest: {}", describe_fit(smallest)));
    if (a.chosen_row) {
      const PlanRow& row = plan.rows[*a.chosen_row];
      a.reasons.push_back(fmt::format("{} fits by holding at most {} tokens per sequence: {}", row.option.label,
                                      row.option.token_budget, describe(plan, row)));
      a.reasons.push_back(eviction_tradeoff(row));
    } else if (evicting.empty()) {
      a.reasons.push_back(fmt::format("with {} at most {} tokens per sequence fit for {} sequences: lower --ctx or "
                                      "--batch, or bound the cache with --policy streaming --budget N",
                                      smallest.option.label, smallest.fit->tokens / plan.request.batch,
                                      plan.request.batch));
    } else {
      a.reasons.push_back(fmt::format("nor does any evicting option: {}",
                                      describe_fit(plan.rows[smallest_row(plan, evicting)])));
    }
  } else if (*a.chosen_row != order.front()) {
    a.reasons.push_back(describe(plan, plan.rows[*a.chosen_row]));
  }
  if (a.chosen_row) a.reasons.push_back(describe_fit(plan.rows[*a.chosen_row]));
}

// Long chat without streaming rows in the plan: the full cache, and how long it can grow.
void advise_long_chat_full_cache(const Plan& plan, Advice& a) {
  a.not_available.push_back(
      "StreamingLLM (attention sinks + a recent window, a fixed token budget, so memory stops growing) is the method "
      "for long streaming chat; this plan has no streaming rows: add --policy streaming --budget N");
  const std::vector<size_t> order = candidates(plan, RowKind::kFull);
  a.chosen_row = plan.request.memory_bytes ? first_fitting(plan, order) : std::optional<size_t>(order.front());
  if (!a.chosen_row) {
    a.reasons.push_back(fmt::format("no option holds {} tokens × {} sequences: {}", plan.request.ctx,
                                    plan.request.batch, describe_fit(plan.rows[smallest_row(plan, order)])));
    return;
  }
  const PlanRow& row = plan.rows[*a.chosen_row];
  a.reasons.push_back(fmt::format(
      "a full cache grows by {} per token; with {} the chat holds {} per sequence at {} tokens and must be cut or "
      "restarted beyond that",
      format_bytes(growth_per_token(plan, row, row.tokens_per_sequence)), row.option.label,
      format_bytes(kv_bytes_for_context(plan.shape, row.footprint, row.tokens_per_sequence)),
      row.tokens_per_sequence));
  a.reasons.push_back(describe(plan, row));
  if (row.fit) a.reasons.push_back(describe_fit(row));
}

void advise_long_chat(const Plan& plan, Advice& a) {
  const std::vector<size_t> order = streaming_only(plan, candidates(plan, RowKind::kEvicting));
  if (order.empty()) return advise_long_chat_full_cache(plan, a);
  a.chosen_row = plan.request.memory_bytes ? first_fitting(plan, order) : std::optional<size_t>(order.front());
  if (!a.chosen_row) {
    a.reasons.push_back(fmt::format("no codec holds {} sequences under streaming {}: {}; lower --budget or --batch",
                                    plan.request.batch, plan.rows[order.front()].option.token_budget,
                                    describe_fit(plan.rows[smallest_row(plan, order)])));
    return;
  }
  const PlanRow& row = plan.rows[*a.chosen_row];
  const int64_t budget = row.option.token_budget;
  const uint64_t per_sequence = row.block_bytes_total / static_cast<uint64_t>(plan.request.batch);
  a.reasons.push_back(fmt::format(
      "StreamingLLM keeps {} attention sinks + the {} most recent tokens: {} holds {} blocks ({}) per sequence from "
      "token {} on, however long the chat runs, where a full {} cache grows by {} per token ({} per sequence at {} "
      "tokens)",
      row.option.sinks, budget - row.option.sinks, row.option.label, row.blocks_per_sequence,
      format_bytes(static_cast<double>(per_sequence)), budget, kv_type_name(row.option.k_type),
      format_bytes(growth_per_token(plan, row, plan.request.ctx)),
      format_bytes(kv_bytes_for_context(plan.shape, row.footprint, plan.request.ctx)), plan.request.ctx));
  a.reasons.push_back(describe(plan, row));
  if (row.fit) a.reasons.push_back(describe_fit(row));
  if (budget <= plan.shape.context_length) {
    a.reasons.push_back(fmt::format("the sinks and the window are rotated within the budget of {} tokens, inside "
                                    "the trained context of {}: the chat can run past it",
                                    budget, plan.shape.context_length));
  } else {
    a.reasons.push_back(fmt::format("the budget of {} tokens is past the trained context of {}: keep --budget <= {}",
                                    budget, plan.shape.context_length, plan.shape.context_length));
  }
  a.reasons.push_back("tokens that leave the window are gone: the chat cannot quote them; use --advise long-recall "
                      "when exact recall over the whole text matters");
}

void advise_long_recall(const Plan& plan, Advice& a) {
  a.reasons.push_back(
      "exact recall must not evict: any dropped token may be the one asked about, and evicted details are gone "
      "(measured with `kvlm eval recall --policy`: once the needle is older than the budget, accuracy falls to the "
      "control without the document); so the cache keeps every token and quantization, not eviction, saves memory");
  const std::vector<size_t> order = candidates(plan, RowKind::kFull);
  if (!candidates(plan, RowKind::kEvicting).empty()) {
    a.reasons.push_back("the plan's evicting rows are not considered for recall");
  }
  a.chosen_row = plan.request.memory_bytes ? first_fitting(plan, order) : std::optional<size_t>(order.front());
  if (a.chosen_row) {
    const PlanRow& row = plan.rows[*a.chosen_row];
    a.reasons.push_back(describe(plan, row));
    if (row.fit) a.reasons.push_back(describe_fit(row));
    if (row_quality(row).tier > QualityTier::kNearLossless) {
      a.reasons.push_back(fmt::format("{} stores fewer than 8 bits per value: verify recall with `kvlm eval recall`",
                                      row.option.label));
    }
  } else {
    const PlanRow& smallest = plan.rows[smallest_row(plan, order)];
    a.reasons.push_back(fmt::format("no full cache of {} tokens × {} sequences fits: {}", plan.request.ctx,
                                    plan.request.batch, describe_fit(smallest)));
    note_missing_quantized_codecs(plan, a);
  }
  a.reasons.push_back(architecture_note(plan));
}

// The smallest fitting option of `order` within the quality bar, else the least lossy fitting one below it.
std::optional<size_t> concurrency_pick(const Plan& plan, const std::vector<size_t>& order) {
  const std::optional<size_t> smallest = smallest_within_bar(plan, order);
  if (smallest && fits(plan, plan.rows[*smallest])) return smallest;
  std::vector<size_t> below_bar;
  for (size_t i : order) {
    if (!within_bar(plan.rows[i])) below_bar.push_back(i);
  }
  return first_fitting(plan, below_bar);
}

void advise_concurrency(const Plan& plan, Advice& a) {
  a.reasons.push_back(fmt::format(
      "kvlm pages the cache in blocks of {} tokens: a sequence holds ceil(tokens / {}) blocks and wastes at most one "
      "partly filled block per layer, so sequences share memory without reserving the model's full context",
      plan.request.block_size, plan.request.block_size));
  // The quality bar is ≈ lossless (8 bits or more); within it the smallest option maximises
  // concurrency. Below the bar only if the target is missed otherwise; eviction only if no full
  // cache reaches it at all.
  const std::vector<size_t> full = candidates(plan, RowKind::kFull);
  a.chosen_row = concurrency_pick(plan, full);
  if (a.chosen_row && !within_bar(plan.rows[*a.chosen_row])) {
    a.reasons.push_back(fmt::format("no option of 8 bits or more reaches {} sequences, so a lossier codec is needed",
                                    plan.request.batch));
  }
  if (!a.chosen_row) {
    a.chosen_row = concurrency_pick(plan, candidates(plan, RowKind::kEvicting));
    if (a.chosen_row) {
      a.reasons.push_back(fmt::format("no full cache reaches {} sequences of {} tokens: {}", plan.request.batch,
                                      plan.request.ctx, describe_fit(plan.rows[smallest_row(plan, full)])));
      a.reasons.push_back(eviction_tradeoff(plan.rows[*a.chosen_row]));
    }
  }
  if (!a.chosen_row) {
    const PlanRow& smallest = plan.rows[smallest_row(plan, full)];
    a.reasons.push_back(fmt::format("the target of {} sequences of {} tokens does not fit: {}", plan.request.batch,
                                    plan.request.ctx, describe_fit(smallest)));
    note_missing_quantized_codecs(plan, a);
    return;
  }
  const PlanRow& row = plan.rows[*a.chosen_row];
  a.reasons.push_back(fmt::format("{} is the smallest option meeting the quality bar: {}", row.option.label,
                                  describe(plan, row)));
  if (row.fit) {
    a.reasons.push_back(describe_fit(row));
  } else {
    a.reasons.push_back("give --memory to compute how many sequences fit");
  }
}

// Below this many tokens a streaming window holds too little of a conversation to recommend.
constexpr int64_t kMinAdviceBudget = 256;

// The largest streaming budget (whole blocks, at most `cap`) for which plan.request.batch
// sequences of `row`'s codec fit in the plan's memory; 0 when that is under kMinAdviceBudget.
int64_t fitting_streaming_budget(const Plan& plan, const PlanRow& row, int64_t cap) {
  if (!row.fit) return cap;
  const uint64_t per_sequence = row.fit->available_bytes / static_cast<uint64_t>(plan.request.batch);
  const uint64_t staging = row.staging_bytes_per_sequence;
  if (per_sequence <= staging || row.footprint.bytes_per_block == 0) return 0;
  const ModelShape& shape = plan.shape;
  const int64_t local_cap = shape.has_local_layers() ? local_layer_block_cap(plan.request.step_tokens,
                                                                             shape.sliding_window.window,
                                                                             plan.request.block_size)
                                                     : 0;
  const int64_t blocks = max_global_blocks(shape, row.footprint, per_sequence - staging, local_cap) -
                         evicted_slot_blocks("streaming");
  const int64_t budget = std::min(cap, blocks * plan.request.block_size);
  return budget >= kMinAdviceBudget ? budget : 0;
}

bool has_policy(const PlanRequest& request, std::string_view policy) {
  return std::any_of(request.evictions.begin(), request.evictions.end(),
                     [&](const PlanEviction& e) { return e.policy == policy; });
}

}  // namespace

std::optional<Scenario> parse_scenario(std::string_view name) {
  for (const ScenarioName& s : kScenarios) {
    if (s.name == name) return s.scenario;
  }
  return std::nullopt;
}

std::string_view scenario_name(Scenario scenario) {
  for (const ScenarioName& s : kScenarios) {
    if (s.scenario == scenario) return s.name;
  }
  return "unknown";
}

std::string scenario_list() {
  std::string names;
  for (const ScenarioName& s : kScenarios) names += fmt::format("{}{}", names.empty() ? "" : ", ", s.name);
  return names;
}

namespace {

// Relative RMS error of one codec and role over a fixed pseudo-random block: Gaussian-like
// values with a few large channels, as keys have (KIVI's motivation for per-channel keys).
double measured_error(KvType type, KvRole role) {
  const KvLayout layout{1, 2, 128, 32};
  const size_t n = layout.values_per_token() * static_cast<size_t>(layout.block_size);
  std::vector<float> src(n);  // [block_size, num_kv_heads, head_dim]
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < n; ++i) {
    float sum = 0;
    for (int k = 0; k < 4; ++k) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      sum += static_cast<float>(state >> 40) / static_cast<float>(1 << 24);
    }
    const size_t channel = i % static_cast<size_t>(layout.head_dim);
    src[i] = (sum - 2.0f) * (channel % 16 == 0 ? 8.0f : 1.0f);
  }
  const KvCodec& codec = kv_codec(type, role);
  std::vector<std::byte> block(codec.block_bytes(layout));
  codec.encode_block(layout, src.data(), block.data());
  std::vector<float> out(layout.values_per_token());  // [num_kv_heads, head_dim]
  double err = 0, ref = 0;
  for (int slot = 0; slot < layout.block_size; ++slot) {
    codec.decode_token(layout, block.data(), slot, out.data());
    for (size_t j = 0; j < out.size(); ++j) {
      const double x = src[static_cast<size_t>(slot) * out.size() + j];
      err += (x - out[j]) * (x - out[j]);
      ref += x * x;
    }
  }
  return std::sqrt(err / ref);
}

CodecQuality measure_quality(KvType type) {
  // A layout large enough that per-block scales are spread as they are in real models.
  const KvLayout probe{1, 8, 128, 32};
  const double values = static_cast<double>(probe.values_per_token() * static_cast<size_t>(probe.block_size));
  CodecQuality q;
  q.bits_per_value = static_cast<double>(kv_block_bytes(probe, type, type)) * 4.0 / values;  // mean of K and V
  q.tier = q.bits_per_value >= 32   ? QualityTier::kExact
           : q.bits_per_value >= 16 ? QualityTier::kLossless
           : q.bits_per_value >= 8  ? QualityTier::kNearLossless
           : q.bits_per_value >= 4  ? QualityTier::kFourBit
                                    : QualityTier::kTwoBit;
  q.relative_rms_error = std::max(measured_error(type, KvRole::kKey), measured_error(type, KvRole::kValue));
  return q;
}

}  // namespace

CodecQuality codec_quality(KvType type) {
  // Measured once per type for the whole program (codecs are fixed singletons).
  static const std::vector<CodecQuality> kQualities = [] {
    std::vector<CodecQuality> q;
    for (KvType t : all_kv_types()) {
      const size_t i = static_cast<size_t>(t);
      if (q.size() <= i) q.resize(i + 1);
      q[i] = measure_quality(t);
    }
    return q;
  }();
  const size_t i = static_cast<size_t>(type);
  return i < kQualities.size() ? kQualities[i] : measure_quality(type);
}

std::string_view quality_tier_name(QualityTier tier) {
  switch (tier) {
    case QualityTier::kExact:
      return "exact";
    case QualityTier::kLossless:
      return "lossless";
    case QualityTier::kNearLossless:
      return "near-lossless";
    case QualityTier::kFourBit:
      return "4-bit";
    case QualityTier::kTwoBit:
      return "2-bit";
  }
  return "unknown";
}

Result<Plan> make_advice_plan(const ModelShape& shape, const PlanRequest& request, Scenario scenario) {
  KVLM_ASSIGN_OR_RETURN(Plan plan, make_plan(shape, request));
  if (scenario == Scenario::kLongRecall) return plan;
  const std::vector<size_t> full = candidates(plan, RowKind::kFull);
  const std::optional<size_t> bar_row = smallest_within_bar(plan, full);
  int64_t budget = 0;
  if (scenario == Scenario::kLongChat) {
    if (has_policy(request, "streaming")) return plan;
    budget = std::min(request.ctx, shape.context_length);
    if (bar_row) budget = std::min(budget, std::max<int64_t>(fitting_streaming_budget(plan, plan.rows[*bar_row], budget), 0));
    if (budget <= 0) budget = std::min(request.ctx, shape.context_length);  // nothing fits: show the trained context
  } else {
    const bool full_fits = std::any_of(full.begin(), full.end(), [&](size_t i) { return fits(plan, plan.rows[i]); });
    if (!request.evictions.empty() || !request.memory_bytes || full_fits || !bar_row) return plan;
    // Below ctx: at ctx or more the full cache would have fit.
    budget = fitting_streaming_budget(plan, plan.rows[*bar_row], std::min(request.ctx - 1, shape.context_length));
    if (budget <= 0) return plan;
  }
  PlanRequest with_streaming = request;
  PlanEviction streaming;
  streaming.policy = "streaming";
  streaming.budget = budget;
  streaming.sinks = static_cast<int>(std::min<int64_t>(kAdviceSinks, budget - 1));
  with_streaming.evictions.push_back(streaming);
  return make_plan(shape, with_streaming);
}

Result<Advice> advise(const Plan& plan, Scenario scenario) {
  if (candidates(plan, RowKind::kFull).empty()) return Status::error("the plan has no full-cache KV options");
  if (scenario == Scenario::kLimitedMemory && !plan.request.memory_bytes) {
    return Status::error("--advise limited-memory needs --memory (e.g. --memory 24GiB)");
  }
  Advice a;
  a.scenario = scenario;
  switch (scenario) {
    case Scenario::kLimitedMemory:
      advise_limited_memory(plan, a);
      break;
    case Scenario::kLongChat:
      advise_long_chat(plan, a);
      break;
    case Scenario::kLongRecall:
      advise_long_recall(plan, a);
      break;
    case Scenario::kConcurrency:
      advise_concurrency(plan, a);
      break;
  }
  if (plan.shape.has_local_layers()) a.reasons.push_back(sliding_window_note(plan));
  if (a.chosen_row) {
    const PlanRow& row = plan.rows[*a.chosen_row];
    a.recommendation = fmt::format("{} ({}{}, block size {})", flags_for(row), row.option.label,
                                   row.option.evicts() ? "" : ", full cache", plan.request.block_size);
  } else {
    a.recommendation = "nothing fits: lower --ctx or --batch, or add memory";
  }
  return a;
}

}  // namespace kvlm
