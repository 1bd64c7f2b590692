// `kvlm inspect`: architecture, shapes, tensor types, vocabulary and KV bytes per token of a GGUF model.
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

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return fmt::format("{:.1f} {}", bytes, units[u]);
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
  if (f.tensors) {
    for (const GgufTensorInfo& t : file->tensors()) {
      std::printf("  %-32s %-6s [%s]\n", t.name.c_str(), std::string(ggml_type_name(t.type)).c_str(),
                  fmt::format("{}", fmt::join(t.dims, ", ")).c_str());
    }
  }

  auto config = ModelConfig::from_gguf(*file);
  if (!config.ok()) {
    std::printf("model            not loadable: %s\n", config.status().message().c_str());
    return;
  }
  const ModelConfig& c = *config;
  std::printf("architecture     %s%s\n", c.architecture.c_str(), c.name.empty() ? "" : (" (" + c.name + ")").c_str());
  std::printf("shape            %d layers, dim %d, ffn %d, vocab %d, context %d\n", c.num_layers, c.dim, c.ffn_dim,
              c.vocab_size, c.context_length);
  std::printf("attention        %s: %d query heads, %d kv heads (group %d), head_dim %d\n",
              c.attention_kind().c_str(), c.num_heads, c.num_kv_heads, c.group_size(), c.head_dim);
  std::printf("rope             %s, base %g, linear scale %g, %d rotary dims%s\n",
              c.rope.style == RopeStyle::kNeox ? "neox" : "normal (adjacent pairs)", c.rope.freq_base,
              1.0 / c.rope.freq_scale, c.rope.rotary_dim, c.has_qkv_bias ? ", q/k/v biases" : "");
  std::printf("output           %s\n", c.tied_output ? "tied to token_embd" : "separate output.weight");

  if (auto vocab = load_tokenizer_vocab(*file); vocab.ok()) {
    std::printf("vocab            %s, %zu tokens, bos %d, eos %d, add_bos %s%s\n", vocab->model.c_str(),
                vocab->tokens.size(), vocab->bos_id, vocab->eos_id, vocab->add_bos ? "yes" : "no",
                vocab->pre.empty() ? "" : (", pre " + vocab->pre).c_str());
  } else {
    std::printf("vocab            not loadable: %s\n", vocab.status().message().c_str());
  }

  std::printf("KV cache         bytes per token = 2 x %d layers x %d kv heads x %d dims x bytes per value\n",
              c.num_layers, c.num_kv_heads, c.head_dim);
  // Every codec of this build, through the planner (the same numbers `kvlm plan` and the live pool give).
  const ModelShape shape = model_shape_from_config(c);
  for (KvType type : all_kv_types()) {
    const auto footprint = kv_footprint(shape, type, type, CacheForm::kFull, 16);
    if (!footprint.ok()) continue;
    const double per_token = footprint->bytes_per_token();
    std::printf("  %-6s %10.1f bytes/token   %s at the full context of %d tokens (16-token blocks, scales included)\n",
                std::string(kv_type_name(type)).c_str(), per_token, human_bytes(per_token * c.context_length).c_str(),
                c.context_length);
  }
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
