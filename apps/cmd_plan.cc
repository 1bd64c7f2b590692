// `kvlm plan`: KV memory per token, totals and memory fit for every KV option, and --advise.
#include <cstdio>
#include <memory>
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_error.h"
#include "commands.h"
#include "kv_flags.h"
#include "core/dtype.h"
#include "evict/eviction_options.h"
#include "plan/kv_advisor.h"
#include "plan/kv_planner.h"
#include "plan/memory_size.h"
#include "plan/model_shape.h"

namespace kvlm::cli {
namespace {

struct PlanFlags {
  std::string model;
  std::string preset;
  int layers = 0;
  int heads = 0;
  int kv_heads = 0;      // 0: same as heads
  int head_dim = 0;
  int v_head_dim = 0;    // 0: same as head_dim
  int kv_lora_rank = 0;
  int rope_dim = 0;
  int sliding_window = 0;       // explicit shape: local layers' window; 0: none
  int local_layers_period = 0;  // explicit shape: layer l is global when l % period == period - 1
  double params = 0;
  int64_t ctx = 0;       // 0: the model's context
  int64_t batch = 1;
  int block_size = 16;
  int64_t step_tokens = 1;      // local layers: the longest step (prompt chunk)
  int kivi_residual = KvTypeFlags::kDefaultKiviResidual;  // the same default as run/eval/bench
  std::string memory;
  std::string weight_type;  // empty: the GGUF's own bytes, else f16 for presets
  std::string advise;
  std::string policy;       // empty or "none": full-cache rows only
  int64_t budget = 0;
  int sinks = kAdviceSinks;
  bool budget_given = false;
  bool sinks_given = false;
  bool params_given = false;
  bool window_given = false;
  bool step_given = false;
  bool period_given = false;
  bool json = false;
};

// The eviction rows asked for on the command line, validated as `kvlm run` validates them.
std::vector<PlanEviction> resolve_evictions(const PlanFlags& f) {
  const EvictionPolicy policy = value_or_throw(parse_eviction_policy(f.policy.empty() ? "none" : f.policy));
  std::vector<EvictionField> fields_set;
  if (f.budget_given) fields_set.push_back(EvictionField::kBudget);
  if (f.sinks_given) fields_set.push_back(EvictionField::kSinks);
  throw_if_error(validate_eviction_fields_set(policy, fields_set));
  if (policy == EvictionPolicy::kNone) return {};
  if (f.budget < 1 || f.budget > (int64_t{1} << 28)) {
    throw CliError(fmt::format("--policy {} needs --budget in [1, 2^28] (got {})", eviction_policy_name(policy),
                               f.budget));
  }
  if (policy == EvictionPolicy::kSnapKv && f.budget < 2) {
    throw CliError("--policy snapkv needs --budget >= 2 (its observation window stays within the budget)");
  }
  EvictionOptions options;
  options.policy = policy;
  options.budget = static_cast<int>(f.budget);
  options.sinks = f.sinks;
  // Only budget and sinks change bytes; the other knobs keep their defaults, clamped to the budget.
  options.snapkv_window = std::min(options.snapkv_window, std::max(1, options.budget - 1));
  throw_if_error(validate_eviction_options(options));
  PlanEviction e;
  e.policy = eviction_policy_name(policy);
  e.budget = f.budget;
  e.sinks = f.sinks;
  throw_if_error(validate_plan_eviction(e));
  return {e};
}

// What the rows mean for the policies, and whether a ctx past the model's context matters.
std::vector<std::string> plan_notes(const Plan& plan) {
  std::vector<std::string> notes;
  const int64_t ctx = plan.request.ctx, trained = plan.shape.context_length;
  for (const PlanEviction& e : plan.request.evictions) {
    const std::string head = e.policy == "streaming"
                                 ? fmt::format("streaming {} ({} sinks + {} recent)", e.budget, e.sinks, e.budget - e.sinks)
                                 : fmt::format("{} {}", e.policy, e.budget);
    if (e.policy == "window" || e.policy == "streaming") {
      notes.push_back(fmt::format("{}: {} resident tokens per sequence; once past the budget, whole blocks include "
                                  "{} blocks of evicted slots not yet dropped; memory stays flat however long the "
                                  "text",
                                  head, std::min(ctx, e.budget), evicted_slot_blocks(e.policy)));
    } else if (e.policy == "h2o") {
      notes.push_back(fmt::format("{}: {} resident tokens per sequence, survivors compacted: no extra blocks", head,
                                  std::min(ctx, e.budget)));
    } else {
      notes.push_back(fmt::format("{}: {} resident tokens after compression; a prompt step runs whole on top of "
                                  "the budget first, counted as a step of the budget (a longer prompt step peaks "
                                  "higher)",
                                  head, std::min(ctx, e.budget)));
    }
  }
  if (ctx > trained) {
    std::vector<std::string> flat;
    for (const PlanEviction& e : plan.request.evictions) {
      if ((e.policy == "window" || e.policy == "streaming") && e.budget <= trained) {
        flat.push_back(fmt::format("{} {}", e.policy, e.budget));
      }
    }
    if (flat.empty()) {
      notes.push_back(fmt::format("{} tokens is past the model's context of {}: the model was not trained that long",
                                  ctx, trained));
    } else {
      std::string names;
      for (const std::string& n : flat) names += (names.empty() ? "" : ", ") + n;
      notes.push_back(fmt::format("{} tokens is past the model's context of {}: fine with {} (memory flat at the "
                                  "budget, attention distances within it); the other rows need a model trained "
                                  "that long",
                                  ctx, trained, names));
    }
  }
  return notes;
}

bool explicit_shape(const PlanFlags& f) {
  return f.layers || f.heads || f.kv_heads || f.head_dim || f.v_head_dim || f.kv_lora_rank || f.rope_dim;
}

// --sliding-window and --local-layers-period on an explicit shape: Gemma 3's period 6 unless given.
SlidingWindowConfig resolve_sliding_window(const PlanFlags& f) {
  if (f.period_given && !f.window_given) {
    throw CliError("--local-layers-period needs --sliding-window W (the local layers' window in tokens)");
  }
  if (!f.window_given) return {};
  if (f.sliding_window < 1) throw CliError(fmt::format("--sliding-window {} must be >= 1 token", f.sliding_window));
  const int period = f.period_given ? f.local_layers_period : kGemma3SlidingWindowPeriod;
  if (period < 2 || period > f.layers + 1) {
    throw CliError(fmt::format("--local-layers-period {} must be in [2, {}] (--layers + 1: every layer local); "
                               "period N makes layers N-1, 2N-1, ... global",
                               period, f.layers + 1));
  }
  SlidingWindowConfig window;
  window.window = f.sliding_window;
  window.local_layers = local_layers_from_period(period, f.layers);
  return window;
}

ModelShape resolve_shape(const PlanFlags& f) {
  const int sources = !f.model.empty() + !f.preset.empty() + explicit_shape(f);
  if (sources != 1) {
    throw CliError("give exactly one of --model FILE.gguf, --preset NAME, or --layers/--heads/--head-dim (presets: " +
                   preset_list() + ")");
  }
  if ((f.window_given || f.period_given) && !explicit_shape(f)) {
    throw CliError("--sliding-window and --local-layers-period describe an explicit shape (--layers, --heads, "
                   "--head-dim); presets and GGUF files state their own local layers");
  }
  ModelShape shape;
  if (!f.model.empty()) {
    if (f.params_given) {
      throw CliError("--params does nothing with --model: the parameter count is read from the GGUF's tensors; drop "
                     "--params, or give --preset or an explicit shape instead of --model");
    }
    shape = value_or_throw(load_model_shape(f.model));
  } else if (!f.preset.empty()) {
    shape = value_or_throw(find_preset(f.preset));
  } else {
    if (!f.layers || !f.heads || !f.head_dim) throw CliError("an explicit shape needs --layers, --heads and --head-dim");
    if (f.rope_dim && !f.kv_lora_rank) throw CliError("--rope-dim needs --kv-lora-rank (MLA)");
    shape.name = "custom";
    shape.architecture = f.kv_lora_rank ? "mla" : "custom";
    shape.num_layers = f.layers;
    shape.num_heads = f.heads;
    shape.num_kv_heads = f.kv_heads ? f.kv_heads : f.heads;
    shape.head_dim = f.head_dim;
    shape.v_head_dim = f.v_head_dim ? f.v_head_dim : f.head_dim;
    shape.kv_lora_rank = f.kv_lora_rank;
    shape.rope_head_dim = f.rope_dim;
    shape.context_length = f.ctx > 0 ? f.ctx : 4096;
    shape.num_params = f.params;
    shape.sliding_window = resolve_sliding_window(f);
    throw_if_error(validate_model_shape(shape));
  }
  if (f.params > 0 && f.model.empty()) shape.num_params = f.params;
  if (f.step_given && !shape.has_local_layers()) {
    throw CliError(fmt::format("--step-tokens changes only local (sliding-window) layers, and {} has none",
                               shape.name));
  }
  return shape;
}

// Weight bytes: the GGUF's tensor bytes, unless --weight-type asks what another type would take.
struct Weights {
  uint64_t bytes = 0;
  std::string source;
};
Weights resolve_weights(const PlanFlags& f, const ModelShape& shape) {
  if (f.weight_type.empty() && shape.weight_bytes > 0) return {shape.weight_bytes, "tensor bytes of the GGUF"};
  const std::string type_name = f.weight_type.empty() ? "f16" : f.weight_type;
  const auto type = parse_ggml_type(type_name);
  // Planning needs only a type's size per value, so types kvlm cannot compute with plan too.
  if (!type || ggml_type_traits(*type).block_bytes == 0) {
    throw CliError(fmt::format("--weight-type '{}' is not a GGML weight type (e.g. {})", type_name,
                               supported_ggml_type_names()));
  }
  if (shape.num_params <= 0) return {0, "unknown (give --params)"};
  return {value_or_throw(weight_bytes_for(shape.num_params, *type)),
          fmt::format("{:.3g} params × {}", shape.num_params, ggml_type_name(*type))};
}

// Every global layer's index (all of them without local layers).
std::vector<int> global_layers(const ModelShape& s) {
  std::vector<int> layers;
  for (int l = 0; l < s.num_layers; ++l) {
    if (!s.sliding_window.is_local(l)) layers.push_back(l);
  }
  return layers;
}

nlohmann::json shape_json(const ModelShape& s) {
  return {{"name", s.name},
          {"architecture", s.architecture},
          {"num_layers", s.num_layers},
          {"num_heads", s.num_heads},
          {"num_kv_heads", s.num_kv_heads},
          {"head_dim", s.head_dim},
          {"v_head_dim", s.v_head_dim},
          {"context_length", s.context_length},
          {"num_params", s.num_params},
          {"kv_lora_rank", s.kv_lora_rank},
          {"rope_head_dim", s.rope_head_dim},
          {"mla", s.is_mla()},
          {"sliding_window", s.sliding_window.window},
          {"num_local_layers", s.num_local_layers()},
          {"global_layers", global_layers(s)}};
}

nlohmann::json row_json(const PlanRow& r) {
  nlohmann::json j = {{"label", r.option.label},
                      {"baseline", r.is_baseline},
                      {"k_type", kv_type_name(r.option.k_type)},
                      {"v_type", r.option.form == CacheForm::kLatent ? "" : kv_type_name(r.option.v_type)},
                      {"form", r.option.form == CacheForm::kLatent ? "latent" : "full"},
                      {"policy", r.option.policy},
                      {"token_budget", r.option.token_budget},
                      {"sinks", r.option.sinks},
                      {"blocks_per_sequence", r.blocks_per_sequence},
                      {"policy_extra_blocks", r.policy_extra_blocks},
                      {"local_blocks_per_sequence", r.local_blocks_per_sequence},
                      {"bytes_per_token", r.footprint.bytes_per_token()},
                      {"bytes_per_token_at_ctx", r.bytes_per_token_at_ctx},
                      {"bytes_per_block", r.footprint.bytes_per_block},
                      {"k_block_bytes_per_layer", r.footprint.k_block_bytes},
                      {"v_block_bytes_per_layer", r.footprint.v_block_bytes},
                      {"tokens_per_sequence", r.tokens_per_sequence},
                      {"total_bytes_formula", r.formula_bytes},
                      {"total_bytes_blocks", r.block_bytes_total},
                      {"ratio_to_baseline", r.ratio_to_baseline},
                      {"ratio_at_ctx", r.ratio_at_ctx},
                      {"staging_bytes_per_sequence", r.staging_bytes_per_sequence}};
  const CodecQuality k = codec_quality(r.option.k_type);
  j["k_quality"] = {{"tier", quality_tier_name(k.tier)},
                    {"bits_per_value", k.bits_per_value},
                    {"relative_rms_error", k.relative_rms_error}};
  if (r.fit) {
    j["fit"] = {{"available_bytes", r.fit->available_bytes},
                {"tokens", r.fit->tokens},
                {"sequences", r.fit->sequences}};
  }
  return j;
}

void print_json(const Plan& plan, const Weights& weights, const std::optional<Advice>& advice) {
  nlohmann::json j = {{"model", shape_json(plan.shape)},
                      {"ctx", plan.request.ctx},
                      {"ctx_past_model_context", plan.request.ctx > plan.shape.context_length},
                      {"batch", plan.request.batch},
                      {"block_size", plan.request.block_size},
                      {"step_tokens", plan.request.step_tokens},
                      {"weight_bytes", weights.bytes},
                      {"weight_source", weights.source},
                      {"baseline_bytes_per_token", plan.baseline_bytes_per_token}};
  if (plan.request.memory_bytes) j["memory_bytes"] = *plan.request.memory_bytes;
  j["warnings"] = plan.shape.warnings;
  if (plan.shape.has_local_layers()) {
    const ModelShape& s = plan.shape;
    j["local_layers"] = {{"window", s.sliding_window.window},
                         {"num_local_layers", s.num_local_layers()},
                         {"num_global_layers", s.num_global_layers()},
                         {"kept_fraction_at_ctx", s.kept_fraction(plan.request.ctx)},
                         {"saved_fraction_at_ctx", 1.0 - s.kept_fraction(plan.request.ctx)},
                         {"max_blocks_per_local_layer",
                          local_layer_block_cap(plan.request.step_tokens, s.sliding_window.window,
                                                plan.request.block_size)},
                         {"summary", local_layer_saving(s, plan.request.ctx)}};
  }
  j["evictions"] = nlohmann::json::array();
  for (const PlanEviction& e : plan.request.evictions) {
    j["evictions"].push_back({{"policy", e.policy},
                              {"budget", e.budget},
                              {"sinks", e.policy == "streaming" ? e.sinks : 0},
                              {"evicted_slot_blocks", evicted_slot_blocks(e.policy)}});
  }
  j["notes"] = plan_notes(plan);
  j["rows"] = nlohmann::json::array();
  for (const PlanRow& r : plan.rows) j["rows"].push_back(row_json(r));
  if (advice) {
    nlohmann::json a = {{"scenario", scenario_name(advice->scenario)},
                        {"recommendation", advice->recommendation},
                        {"reasons", advice->reasons},
                        {"not_available", advice->not_available}};
    if (advice->chosen_row) {
      a["chosen"] = row_json(plan.rows[*advice->chosen_row]);
    } else {
      a["chosen"] = nullptr;
    }
    j["advice"] = a;
  }
  std::printf("%s\n", j.dump(2).c_str());
}

void print_human(const Plan& plan, const Weights& weights, const std::optional<Advice>& advice) {
  const ModelShape& s = plan.shape;
  std::string attention = s.is_mla() ? fmt::format("MLA, latent {} + {} rope dims", s.kv_lora_rank, s.rope_head_dim)
                          : s.num_kv_heads < s.num_heads ? fmt::format("GQA, {} kv heads", s.num_kv_heads)
                                                         : std::string("MHA");
  std::printf("model      %s (%s): %d layers, %d heads (%s), head dim %d/%d (K/V), context %lld\n", s.name.c_str(),
              s.architecture.c_str(), s.num_layers, s.num_heads, attention.c_str(), s.head_dim, s.v_head_dim,
              static_cast<long long>(s.context_length));
  for (const std::string& warning : s.warnings) std::printf("warning    %s\n", warning.c_str());
  const bool local = s.has_local_layers();
  if (local) {
    std::printf("window     %s (global layers: %s); a local layer holds at most %lld blocks (steps of %lld "
                "token%s)\n",
                local_layer_saving(s, plan.request.ctx).c_str(), global_layer_list(s).c_str(),
                static_cast<long long>(local_layer_block_cap(plan.request.step_tokens, s.sliding_window.window,
                                                             plan.request.block_size)),
                static_cast<long long>(plan.request.step_tokens), plan.request.step_tokens == 1 ? "" : "s");
  }
  std::printf("weights    %s (%s)\n", format_bytes(static_cast<double>(weights.bytes)).c_str(), weights.source.c_str());
  std::printf("request    %lld tokens x %lld sequence%s, blocks of %d tokens%s\n",
              static_cast<long long>(plan.request.ctx), static_cast<long long>(plan.request.batch),
              plan.request.batch == 1 ? "" : "s", plan.request.block_size,
              plan.request.memory_bytes
                  ? fmt::format(", memory {}", format_bytes(static_cast<double>(*plan.request.memory_bytes))).c_str()
                  : "");
  for (const std::string& note : plan_notes(plan)) std::printf("note       %s\n", note.c_str());
  std::printf("\n%-30s %14s %12s", "option", "bytes/token", "per token");
  if (local) std::printf(" %12s", "at ctx");
  std::printf(" %10s %14s %8s", "tokens/seq", "total", "ratio");
  if (local) std::printf(" %9s", "ratio@ctx");
  if (plan.request.memory_bytes) std::printf(" %14s %10s", "tokens fit", "seqs fit");
  std::printf("\n");
  for (const PlanRow& r : plan.rows) {
    std::printf("%-30s %14.1f %12s", r.option.label.c_str(), r.footprint.bytes_per_token(),
                format_bytes(r.footprint.bytes_per_token()).c_str());
    if (local) std::printf(" %12s", format_bytes(r.bytes_per_token_at_ctx).c_str());
    std::printf(" %10lld %14s %7.3fx", static_cast<long long>(r.tokens_per_sequence),
                format_bytes(static_cast<double>(r.block_bytes_total)).c_str(), r.ratio_to_baseline);
    if (local) std::printf(" %8.3fx", r.ratio_at_ctx);
    if (r.fit) std::printf(" %14lld %10lld", static_cast<long long>(r.fit->tokens), static_cast<long long>(r.fit->sequences));
    std::printf("\n");
  }
  std::printf("\ntotal = whole blocks of %d tokens per sequence x batch (KIVI: + f32 staging of the tail and "
              "residual blocks; policies: + their evicted-slot blocks); tokens/seq = resident tokens; ratio per "
              "token against the FP16 MHA cache (%.0f B/token)\n",
              plan.request.block_size, plan.baseline_bytes_per_token);
  if (local) {
    std::printf("local layers: bytes/token and ratio are the full cache's (every layer every token); \"at ctx\" and "
                "ratio@ctx divide a sequence's bytes at %lld tokens, local layers holding min(tokens, %d), by its "
                "tokens; "
                "total and fit hold whole blocks per layer; tokens fit = the longest one sequence\n",
                static_cast<long long>(plan.request.ctx), s.sliding_window.window);
  }
  if (advice) {
    std::printf("\nadvice (%s): %s\n", std::string(scenario_name(advice->scenario)).c_str(),
                advice->recommendation.c_str());
    for (const std::string& reason : advice->reasons) std::printf("  - %s\n", reason.c_str());
    for (const std::string& missing : advice->not_available) std::printf("  ! %s\n", missing.c_str());
  }
}

void run(const PlanFlags& f) {
  const ModelShape shape = resolve_shape(f);
  const Weights weights = resolve_weights(f, shape);
  PlanRequest request;
  request.ctx = f.ctx > 0 ? f.ctx : shape.context_length;
  request.batch = f.batch;
  request.block_size = f.block_size;
  request.weight_bytes = weights.bytes;
  request.kivi_residual_tokens = f.kivi_residual;
  request.step_tokens = f.step_tokens;
  request.evictions = resolve_evictions(f);
  if (!f.memory.empty()) request.memory_bytes = value_or_throw(parse_memory_size(f.memory));
  std::optional<Scenario> scenario;
  if (!f.advise.empty()) {
    scenario = parse_scenario(f.advise);
    if (!scenario) throw CliError(fmt::format("--advise '{}' is not one of: {}", f.advise, scenario_list()));
  }
  // --advise may add the rows it recommends (streaming at a budget) beside those asked for.
  const Plan plan = value_or_throw(scenario ? make_advice_plan(shape, request, *scenario) : make_plan(shape, request));
  std::optional<Advice> advice;
  if (scenario) advice = value_or_throw(kvlm::advise(plan, *scenario));
  if (f.json) {
    print_json(plan, weights, advice);
  } else {
    print_human(plan, weights, advice);
  }
}

}  // namespace

CLI::App* add_plan_command(CLI::App& app) {
  auto f = std::make_shared<PlanFlags>();
  CLI::App* cmd = app.add_subcommand("plan", "KV cache memory per token, totals and fit per KV option; --advise");
  cmd->add_option("--model", f->model, "GGUF model file (shapes and weight bytes from the file)");
  cmd->add_option("--preset", f->preset, "built-in shape: " + preset_list());
  cmd->add_option("--layers", f->layers, "explicit shape: layers");
  cmd->add_option("--heads", f->heads, "explicit shape: query heads");
  cmd->add_option("--kv-heads", f->kv_heads, "explicit shape: K/V heads (default: --heads)");
  cmd->add_option("--head-dim", f->head_dim, "explicit shape: K head size");
  cmd->add_option("--v-head-dim", f->v_head_dim, "explicit shape: V head size (default: --head-dim)");
  cmd->add_option("--kv-lora-rank", f->kv_lora_rank, "explicit shape: MLA latent size");
  cmd->add_option("--rope-dim", f->rope_dim, "explicit shape: MLA decoupled rope dims");
  const CLI::Option* window = cmd->add_option(
      "--sliding-window", f->sliding_window, "explicit shape: local layers attend to the last W tokens (Gemma 3)");
  const CLI::Option* period = cmd->add_option(
      "--local-layers-period", f->local_layers_period,
      "explicit shape with --sliding-window: every Nth layer is global, the rest local (default 6)");
  const CLI::Option* params =
      cmd->add_option("--params", f->params, "parameter count, for weight bytes (e.g. 6.74e9; not with --model)");
  cmd->add_option("--ctx", f->ctx, "tokens per sequence (default: the model's context)");
  cmd->add_option("--batch", f->batch, "concurrent sequences")->capture_default_str();
  cmd->add_option("--block-size", f->block_size, "tokens per cache block")->capture_default_str();
  const CLI::Option* step = cmd->add_option("--step-tokens", f->step_tokens,
                  "local layers: the longest step (prompt chunk); a local layer holds window + step - 1 tokens in it")
      ->capture_default_str();
  cmd->add_option("--kivi-residual", f->kivi_residual, "KIVI residual window kept in f32, tokens")
      ->capture_default_str();
  cmd->add_option("--memory", f->memory, "memory for weights + cache: 24GiB, 24GB, 512MiB, bytes");
  cmd->add_option("--weight-type", f->weight_type, "weights as f32|f16|bf16|q8_0|q4_0 (default: the GGUF's, else f16)");
  cmd->add_option("--advise", f->advise, "recommend a configuration: " + scenario_list());
  cmd->add_option("--policy", f->policy, "also list every codec under token eviction: window, streaming, h2o or snapkv");
  CLI::Option* budget = cmd->add_option("--budget", f->budget, "--policy: most tokens a sequence keeps resident");
  CLI::Option* sinks =
      cmd->add_option("--sinks", f->sinks, "--policy streaming: first tokens always kept")->capture_default_str();
  cmd->add_flag("--json", f->json, "print one JSON object");
  cmd->callback([f, budget, sinks, params, window, period, step] {
    f->step_given = step->count() > 0;
    f->budget_given = budget->count() > 0;
    f->sinks_given = sinks->count() > 0;
    f->params_given = params->count() > 0;
    f->window_given = window->count() > 0;
    f->period_given = period->count() > 0;
    run(*f);
  });
  return cmd;
}

}  // namespace kvlm::cli
