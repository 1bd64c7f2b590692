// `kvlm inspect`: architecture, shapes, tensor types, vocabulary and KV bytes per token of a GGUF model.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli_error.h"
#include "commands.h"
#include "gguf/gguf_file.h"
#include "kv/kv_type.h"
#include "model/llama_weights.h"
#include "model/model_config.h"
#include "model/tokenizer.h"
#include "model/tokenizer_gguf.h"
#include "model_source.h"
#include "plan/kv_planner.h"
#include "plan/model_shape.h"

namespace kvlm::cli {
namespace {

struct InspectFlags {
  std::string model;
  bool tensors = false;
  bool metadata = false;
};

// llama.cpp's names for general.file_type (llama_ftype), as llama-quantize lists them.
const char* file_type_name(int64_t ftype) {
  static const std::map<int64_t, const char*> kNames = {
      {0, "F32"},      {1, "F16"},      {2, "Q4_0"},     {3, "Q4_1"},     {7, "Q8_0"},     {8, "Q5_0"},
      {9, "Q5_1"},     {10, "Q2_K"},    {11, "Q3_K_S"},  {12, "Q3_K_M"},  {13, "Q3_K_L"},  {14, "Q4_K_S"},
      {15, "Q4_K_M"},  {16, "Q5_K_S"},  {17, "Q5_K_M"},  {18, "Q6_K"},    {19, "IQ2_XXS"}, {20, "IQ2_XS"},
      {21, "Q2_K_S"},  {22, "IQ3_XS"},  {23, "IQ3_XXS"}, {24, "IQ1_S"},   {25, "IQ4_NL"},  {26, "IQ3_S"},
      {27, "IQ3_M"},   {28, "IQ2_S"},   {29, "IQ2_M"},   {30, "IQ4_XS"},  {31, "IQ1_M"},   {32, "BF16"},
      {36, "TQ1_0"},   {37, "TQ2_0"},   {38, "MXFP4_MOE"}, {40, "Q1_0"},  {41, "Q2_0"}};
  const auto it = kNames.find(ftype);
  return it == kNames.end() ? nullptr : it->second;
}

// "Q4_K 85%, Q6_K 15%": each type's share of the bytes of the 2-D tensors (the weight
// matrices), largest first; norms and other 1-D tensors are always f32 and say nothing.
std::string quantization_mix(const GgufFile& file) {
  std::map<std::string, uint64_t> bytes;
  uint64_t total = 0;
  for (const GgufTensorInfo& t : file.tensors()) {
    if (t.dims.size() < 2) continue;
    bytes[std::string(ggml_type_name(t.type))] += t.num_bytes;
    total += t.num_bytes;
  }
  std::vector<std::pair<uint64_t, std::string>> order;
  for (const auto& [name, b] : bytes) order.emplace_back(b, name);
  std::sort(order.rbegin(), order.rend());
  std::string out;
  for (const auto& [b, name] : order) {
    out += fmt::format("{}{} {:.0f}%", out.empty() ? "" : ", ", name, 100.0 * static_cast<double>(b) / total);
  }
  return out;
}

std::string rope_description(const ModelConfig& c) {
  std::string out = fmt::format("{}, base {:g}, {} rotary dims", c.rope.style == RopeStyle::kNeox ? "neox" : "normal (adjacent pairs)",
                                c.rope.freq_base, c.rope.rotary_dim);
  switch (c.rope_scaling) {
    case RopeScalingKind::kNone:
      out += ", no scaling";
      break;
    case RopeScalingKind::kLinear:
      out += fmt::format(", linear scaling x{:g}", c.rope_scaling_factor);
      break;
    case RopeScalingKind::kYarn:
      out += fmt::format(", YaRN x{:g} from {} tokens (attention factor {:.4f})", c.rope_scaling_factor,
                         c.rope.yarn.original_context, rope_magnitude(c.rope) * rope_magnitude(c.rope));
      break;
    case RopeScalingKind::kLlama3: {
      const auto [lo, hi] = std::minmax_element(c.rope.freq_factors.begin(), c.rope.freq_factors.end());
      out += fmt::format(", Llama 3 frequency factors {:g}..{:g}", *lo, *hi);
      break;
    }
  }
  return out;
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return fmt::format("{:.1f} {}", bytes, units[u]);
}

// "512 tokens on 22 of 26 layers (global: 5, 11, 17, 23)"
void print_sliding_window(const ModelShape& shape) {
  if (!shape.has_local_layers()) return;
  std::printf("sliding window   %d tokens on %d of %d layers (global: %s)\n", shape.sliding_window.window,
              shape.num_local_layers(), shape.num_layers, global_layer_list(shape).c_str());
}

// Bytes per token of every codec of this build, through the planner (the same numbers `kvlm plan`
// and the live pool give), and what local layers save at the model's context.
void print_kv_cache(const ModelShape& shape) {
  const CacheForm form = shape.is_mla() ? CacheForm::kLatent : CacheForm::kFull;
  if (shape.is_mla()) {
    std::printf("KV cache         bytes per token = %d layers x %d latent values (MLA) x bytes per value\n",
                shape.num_layers, shape.latent_dim());
  } else if (shape.head_dim == shape.v_head_dim) {
    std::printf("KV cache         bytes per token = 2 x %d layers x %d kv heads x %d dims x bytes per value\n",
                shape.num_layers, shape.num_kv_heads, shape.head_dim);
  } else {
    std::printf("KV cache         bytes per token = %d layers x %d kv heads x (%d + %d) K+V dims x bytes per value\n",
                shape.num_layers, shape.num_kv_heads, shape.head_dim, shape.v_head_dim);
  }
  const int64_t ctx = shape.context_length;
  const bool local = shape.has_local_layers();
  for (KvType type : all_kv_types()) {
    const auto footprint = kv_footprint(shape, type, type, form, 16);
    if (!footprint.ok()) continue;
    const double per_token = footprint->bytes_per_token();
    const double at_ctx = kv_bytes_for_context(shape, *footprint, ctx);
    const std::string full_cache =
        local ? fmt::format("; every layer global: {}", human_bytes(per_token * static_cast<double>(ctx))) : "";
    std::printf("  %-6s %10.1f bytes/token   %s at the full context of %lld tokens (16-token blocks, scales "
                "included%s)\n",
                std::string(kv_type_name(type)).c_str(), per_token, human_bytes(at_ctx).c_str(),
                static_cast<long long>(ctx), full_cache.c_str());
  }
  if (local) std::printf("cache saving     %s\n", local_layer_saving(shape, ctx).c_str());
  if (shape.is_mla()) {
    // What the same heads would store without the latent: every head's key and value.
    const double mha = 2.0 * shape.num_layers * shape.num_heads * (shape.head_dim + shape.v_head_dim);
    const double latent = 2.0 * shape.num_layers * shape.latent_dim();
    std::printf("MLA saving       f16: %.0f bytes/token for the latent vs %.0f for MHA over the same %d heads "
                "(K %d + V %d dims each): %.1fx less\n",
                latent, mha, shape.num_heads, shape.head_dim, shape.v_head_dim, mha / latent);
  }
}

void run(const InspectFlags& f) {
  const std::span<const uint8_t> embedded = embedded_model_bytes();
  auto file = value_or_throw(
      f.model.empty() ? GgufFile::from_bytes(std::vector<uint8_t>(embedded.begin(), embedded.end()), kEmbeddedModelName)
                      : GgufFile::open(f.model));
  std::printf("file             %s (GGUF v%u, %s, %zu tensors, %zu metadata keys)\n", file->name().c_str(),
              file->version(), human_bytes(static_cast<double>(file->file_size())).c_str(), file->tensors().size(),
              file->metadata().size());
  if (f.metadata) {
    for (const GgufKeyValue& kv : file->metadata()) {
      std::printf("  %-40s %s\n", kv.key.c_str(), kv.value.to_display_string(8).c_str());
    }
  }

  std::map<std::string, std::pair<int, uint64_t>> by_type;  // type -> (tensors, bytes)
  uint64_t total_bytes = 0;
  for (const GgufTensorInfo& t : file->tensors()) {
    auto& entry = by_type[std::string(ggml_type_name(t.type))];
    ++entry.first;
    entry.second += t.num_bytes;
    total_bytes += t.num_bytes;
  }
  std::string types;
  for (const auto& [name, entry] : by_type) {
    types += fmt::format("{}{} x{} ({})", types.empty() ? "" : ", ", name, entry.first,
                         human_bytes(static_cast<double>(entry.second)));
  }
  std::printf("weights          %s total: %s\n", human_bytes(static_cast<double>(total_bytes)).c_str(), types.c_str());
  {
    std::string stated;
    if (auto ftype = file->get_int("general.file_type"); ftype.ok()) {
      const char* name = file_type_name(*ftype);
      stated = name != nullptr ? fmt::format(" (general.file_type {}: {})", *ftype, name)
                               : fmt::format(" (general.file_type {}: unknown)", *ftype);
    }
    std::printf("quantization     %s of the weight matrices' bytes%s\n", quantization_mix(*file).c_str(), stated.c_str());
  }
  if (f.tensors) {
    for (const GgufTensorInfo& t : file->tensors()) {
      std::printf("  %-32s %-6s [%s]\n", t.name.c_str(), std::string(ggml_type_name(t.type)).c_str(),
                  fmt::format("{}", fmt::join(t.dims, ", ")).c_str());
    }
  }

  auto config = ModelConfig::from_gguf(*file);
  if (!config.ok()) {
    std::printf("runs in kvlm     no: %s\n", config.status().message().c_str());
    // The planner's reader still knows the cache's shape of most files kvlm cannot run.
    if (auto shape = read_model_shape(*file); shape.ok()) {
      for (const std::string& warning : shape->warnings) std::printf("warning          %s\n", warning.c_str());
      print_sliding_window(*shape);
      print_kv_cache(*shape);
    }
    return;
  }
  const ModelConfig& c = *config;
  std::printf("architecture     %s%s\n", c.architecture.c_str(), c.name.empty() ? "" : (" (" + c.name + ")").c_str());
  std::printf("shape            %d layers, dim %d, ffn %d, vocab %d, context %d\n", c.num_layers, c.dim, c.ffn_dim,
              c.vocab_size, c.context_length);
  if (c.is_mla()) {
    const MlaConfig& m = c.mla;
    std::printf("attention        MLA: %d query heads over one latent of %d + %d RoPE dims (per head: key %d + %d, "
                "value %d; %s; %s)\n",
                c.num_heads, m.kv_lora_rank, m.qk_rope_dim, m.qk_nope_dim, m.qk_rope_dim, m.v_head_dim,
                m.q_lora_rank > 0 ? fmt::format("q_lora {}", m.q_lora_rank).c_str() : "plain attn_q",
                m.split_kv_b ? "attn_k_b + attn_v_b" : "attn_kv_b");
  } else {
    std::printf("attention        %s: %d query heads, %d kv heads (group %d), head_dim %d\n",
                c.attention_kind().c_str(), c.num_heads, c.num_kv_heads, c.group_size(), c.head_dim);
  }
  if (c.moe.enabled()) {
    const MoeConfig& e = c.moe;
    std::printf("experts          %d routed (%d per token, %s gating%s%s, scale %g) + %d shared, ffn %d; first %d "
                "layer%s dense\n",
                e.num_experts, e.num_experts_used, expert_gating_name(e.gating),
                e.normalize_weights ? ", renormalised" : "", e.has_expert_bias ? ", selection bias" : "",
                e.weights_scale, e.num_shared_experts, e.expert_ffn_dim, e.leading_dense_layers,
                e.leading_dense_layers == 1 ? "" : "s");
  }
  const ModelShape shape = model_shape_from_config(c);
  print_sliding_window(shape);
  std::printf("rope             %s\n", rope_description(c).c_str());
  if (c.has_qkv_bias || c.has_qk_norm) {
    std::printf("attention extras %s\n", c.has_qkv_bias ? "q/k/v biases" : "per-head RMSNorm of q and k");
  }
  std::printf("chat template    %s\n", file->find("tokenizer.chat_template") != nullptr
                                          ? "yes (tokenizer.chat_template)"
                                          : "none (kvlm chat and /v1/chat/completions use chatml)");
  if (auto weights = LlamaWeights::bind(*file, c); weights.ok()) {
    std::printf("runs in kvlm     yes\n");
  } else {
    std::printf("runs in kvlm     no: %s\n", weights.status().message().c_str());
  }
  std::printf("output           %s\n", c.tied_output ? "tied to token_embd" : "separate output.weight");

  if (auto vocab = load_tokenizer_vocab(*file); vocab.ok()) {
    std::printf("vocab            %s, %zu tokens, bos %d, eos %d, add_bos %s%s\n", vocab->model.c_str(),
                vocab->tokens.size(), vocab->bos_id, vocab->eos_id, vocab->add_bos ? "yes" : "no",
                vocab->pre.empty() ? "" : (", pre " + vocab->pre).c_str());
  } else {
    std::printf("vocab            not loadable: %s\n", vocab.status().message().c_str());
  }

  print_kv_cache(shape);
}

}  // namespace

CLI::App* add_inspect_command(CLI::App& app) {
  auto flags = std::make_shared<InspectFlags>();
  CLI::App* cmd = app.add_subcommand("inspect", "Show a GGUF model's shapes, types, vocabulary and KV cost");
  cmd->add_option("model", flags->model,
                  fmt::format("GGUF model file (default: {}, compiled into kvlm)", kEmbeddedModelName));
  cmd->add_flag("--tensors", flags->tensors, "list every tensor");
  cmd->add_flag("--metadata", flags->metadata, "list every metadata key");
  cmd->callback([flags] { run(*flags); });
  return cmd;
}

}  // namespace kvlm::cli
