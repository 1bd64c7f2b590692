// `kvlm chat`: an interactive terminal chat over the engine and the model's chat template.
// Each turn renders the whole conversation; the previous turns' blocks come back from the
// prefix cache, so a turn computes only its new tokens (/stats shows it).
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "chat/chat_format.h"
#include "cli_error.h"
#include "commands.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "kv_flags.h"
#include "model/llama_model.h"
#include "model/tokenizer.h"
#include "tokenizer_warnings.h"
#include "model_source.h"

namespace kvlm::cli {
namespace {

struct ChatFlags {
  std::string model;
  std::string system;
  int max_tokens = 256;
  float temperature = 0.8f;
  float top_p = 0.95f;
  int64_t seed = 0;
  KvTypeFlags kv;
  int pool_blocks = 1024;
  int block_size = 16;
  int threads = 0;
  bool quiet = false;  // no tokenizer warnings
};

struct TurnStats {
  int prompt_tokens = 0;
  int cached_tokens = 0;
  int completion_tokens = 0;
  double ttft = 0;
  double seconds = 0;
};

std::string stats_text(const TurnStats& t, const Engine& engine) {
  const EngineMetrics m = engine.metrics();
  const double hit_rate = m.prefix_queries_tokens > 0
                              ? 100.0 * static_cast<double>(m.prefix_hit_tokens) / m.prefix_queries_tokens
                              : 0.0;
  return fmt::format(
      "last turn: prompt {} tokens ({} from the prefix cache, {} computed), {} generated, first token {:.3f} s, "
      "{:.1f} tokens/s\n"
      "pool: {} blocks of {} tokens, {} used, {} cached-free (reusable), {} free; {} bytes per block\n"
      "prefix cache: {} of {} prompt tokens supplied over the session ({:.1f}%)\n",
      t.prompt_tokens, t.cached_tokens, t.prompt_tokens - t.cached_tokens, t.completion_tokens, t.ttft,
      t.seconds > t.ttft && t.completion_tokens > 1 ? (t.completion_tokens - 1) / (t.seconds - t.ttft) : 0.0,
      m.blocks_total, engine.options().block_size, m.blocks_used, m.blocks_cached_free, m.blocks_free,
      m.bytes_per_block, m.prefix_hit_tokens, m.prefix_queries_tokens, hit_rate);
}

void run(const ChatFlags& f) {
  if (f.max_tokens < 1) throw CliError(fmt::format("--max-tokens {} must be >= 1", f.max_tokens));
  if (f.pool_blocks < 1) throw CliError(fmt::format("--pool-blocks {} must be >= 1", f.pool_blocks));
  const KvStorageOptions storage = f.kv.storage_options();
  std::unique_ptr<LlamaModel> model = load_model_or_embedded(f.model);
  const Tokenizer& tok = model->tokenizer();
  if (!f.quiet) print_model_warnings(*model);
  auto format = chat::chat_format_for_model(model->file(), tok);
  if (!format.ok()) throw CliError("the model's chat template: " + format.status().message());
  ThreadPool pool(resolve_threads(f.threads));
  EngineOptions eo;
  eo.k_type = f.kv.k_type();
  eo.v_type = f.kv.v_type();
  eo.storage = storage;
  eo.block_size = f.block_size;
  eo.num_blocks = f.pool_blocks;
  auto engine = value_or_throw(Engine::create(*model, pool, eo));
  for (const std::string& warning : engine->warnings()) std::fprintf(stderr, "warning: %s\n", warning.c_str());

  const bool interactive = isatty(STDIN_FILENO) != 0;
  if (interactive) {
    std::fprintf(stderr, "kvlm chat: %s%s. /stats shows the cache, /reset starts over, /quit or Ctrl-D ends.\n",
                 model_display_name(f.model).c_str(),
                 format->is_fallback ? " (no chat template in the file: chatml fallback)" : "");
  }
  nlohmann::json messages = nlohmann::json::array();
  if (!f.system.empty()) messages.push_back({{"role", "system"}, {"content", f.system}});
  TurnStats last;
  uint64_t turn = 0;
  std::string line;
  while (true) {
    if (interactive) std::fprintf(stderr, "\n> ");
    if (!std::getline(std::cin, line)) break;
    if (line == "/quit" || line == "/exit") break;
    if (line == "/stats") {
      std::printf("%s", stats_text(last, *engine).c_str());
      std::fflush(stdout);
      continue;
    }
    if (line == "/reset") {
      messages = nlohmann::json::array();
      if (!f.system.empty()) messages.push_back({{"role", "system"}, {"content", f.system}});
      continue;
    }
    if (line.empty()) continue;
    messages.push_back({{"role", "user"}, {"content", line}});
    auto rendered = format->render(messages, /*add_generation_prompt=*/true);
    if (!rendered.ok()) throw CliError("the chat template: " + rendered.status().message());
    RequestOptions r;
    r.prompt = format->encode(*rendered, tok);
    r.max_tokens = f.max_tokens;
    r.sampler.temperature = f.temperature;
    r.sampler.top_p = f.top_p;
    r.sampler.seed = static_cast<uint64_t>(f.seed) + turn++;
    r.stop_tokens = format->end_of_turn_tokens;
    r.stop_strings = format->end_of_turn_strings;
    std::string reply;
    std::string error;
    auto id = engine->submit(r, [&](const TokenEvent& e) {
      reply += e.text;
      std::fwrite(e.text.data(), 1, e.text.size(), stdout);
      std::fflush(stdout);
      if (e.finish == FinishReason::kError) error = e.error;
      if (e.stats != nullptr) {
        last = TurnStats{e.stats->prompt_tokens, e.stats->cached_prompt_tokens, e.stats->completion_tokens,
                         e.stats->time_to_first_token, e.stats->total_seconds};
      }
    });
    if (!id.ok()) {
      // The conversation no longer fits: say so and let the user /reset.
      std::fprintf(stderr, "kvlm chat: %s (/reset starts over)\n", id.status().message().c_str());
      messages.erase(messages.end() - 1);
      continue;
    }
    engine->run_until_idle();
    std::printf("\n");
    std::fflush(stdout);
    if (!error.empty()) throw CliError("generation failed: " + error);
    messages.push_back({{"role", "assistant"}, {"content", reply}});
  }
  if (engine->leaked_blocks() != 0) throw CliError(fmt::format("{} KV blocks leaked", engine->leaked_blocks()));
}

}  // namespace

CLI::App* add_chat_command(CLI::App& app) {
  auto flags = std::make_shared<ChatFlags>();
  CLI::App* cmd = app.add_subcommand("chat", "Chat in the terminal with the model's chat template");
  cmd->add_option("--model,-m", flags->model, "GGUF model file (default: the embedded stories260K)");
  cmd->add_option("--system", flags->system, "a system message to start the conversation with");
  cmd->add_option("--max-tokens,-n", flags->max_tokens, "most tokens per reply")->capture_default_str();
  cmd->add_option("--temp", flags->temperature, "sampling temperature; 0 = greedy")->capture_default_str();
  cmd->add_option("--top-p", flags->top_p, "nucleus sampling threshold; 1 = off")->capture_default_str();
  cmd->add_option("--seed", flags->seed, "seed of the first reply (each turn adds one)")->capture_default_str();
  flags->kv.add_to(cmd);
  cmd->add_option("--pool-blocks", flags->pool_blocks, "KV blocks in the pool")->capture_default_str();
  cmd->add_option("--block-size", flags->block_size, "tokens per KV block")->capture_default_str();
  cmd->add_option("--threads,-t", flags->threads, "threads (default: all cores)");
  cmd->add_flag("--quiet,-q", flags->quiet, "do not print the tokenizer's warnings on stderr");
  cmd->callback([flags] { run(*flags); });
  return cmd;
}

}  // namespace kvlm::cli
