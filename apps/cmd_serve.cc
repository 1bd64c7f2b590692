// `kvlm serve`: the OpenAI-compatible HTTP server (src/server/) over one engine and pool.
#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "chat/chat_format.h"
#include "cli_error.h"
#include "commands.h"
#include "core/heap_trimmer.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "kv_flags.h"
#include "model/llama_model.h"
#include "model_source.h"
#include "plan/memory_size.h"
#include "server/api_server.h"
#include "server_malloc.h"

namespace kvlm::cli {
namespace {

struct ServeFlags {
  std::string model;
  std::string alias;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;
  KvTypeFlags kv;
  std::string pool_memory;
  int pool_blocks = 0;
  int block_size = 16;
  int max_seqs = 64;
  int max_batch_tokens = 512;
  int max_queue = 256;
  std::string max_body = "8MiB";
  double request_timeout = 600;
  double shutdown_timeout = 30;
  double write_timeout = 30;
  int threads = 0;
  int http_threads = 0;
  int max_n = 16;
  int max_tokens = 1 << 20;
  int max_prompt_tokens = 0;
  int max_streams = 0;
  bool no_prefix_cache = false;
  bool log_prompts = false;
  bool quiet = false;
};

// The default pool: room for every running request at the full context, capped at 1 GiB.
constexpr uint64_t kDefaultPoolBytes = 1ull << 30;

// local_bytes: what the sliding-window layers' own slots take besides the blocks (0 without them).
int resolve_pool_blocks(const ServeFlags& f, const LlamaModel& model, uint64_t bytes_per_block, uint64_t local_bytes) {
  if (f.pool_blocks > 0) return f.pool_blocks;
  uint64_t bytes = kDefaultPoolBytes;
  if (!f.pool_memory.empty()) {
    auto parsed = parse_memory_size(f.pool_memory);
    if (!parsed.ok()) throw CliError("--pool-memory: " + parsed.status().message());
    bytes = *parsed;
  } else {
    const uint64_t blocks_per_seq = (model.config().context_length + f.block_size - 1) / f.block_size;
    bytes = std::min<uint64_t>(bytes, blocks_per_seq * f.max_seqs * bytes_per_block + local_bytes);
  }
  const uint64_t blocks = (bytes > local_bytes ? bytes - local_bytes : 0) / std::max<uint64_t>(1, bytes_per_block);
  if (blocks < 1) {
    throw CliError(fmt::format("--pool-memory {} holds no block ({} bytes each)", f.pool_memory, bytes_per_block));
  }
  return static_cast<int>(std::min<uint64_t>(blocks, 1 << 24));
}

void check_flags(const ServeFlags& f, bool pool_memory_given, bool pool_blocks_given) {
  if (pool_memory_given && pool_blocks_given) {
    throw CliError("--pool-memory and --pool-blocks both size the pool: give one");
  }
  if (pool_blocks_given && f.pool_blocks < 1) throw CliError(fmt::format("--pool-blocks {} must be >= 1", f.pool_blocks));
  if (f.port < 0 || f.port > 65535) throw CliError(fmt::format("--port {} must be in [0, 65535]", f.port));
  if (f.block_size < 1 || f.block_size > 4096) throw CliError(fmt::format("--block-size {} must be in [1, 4096]", f.block_size));
  if (f.max_seqs < 1) throw CliError(fmt::format("--max-seqs {} must be >= 1", f.max_seqs));
  if (f.max_batch_tokens < 1) throw CliError(fmt::format("--max-batch-tokens {} must be >= 1", f.max_batch_tokens));
  if (f.max_queue < 0) throw CliError(fmt::format("--max-queue {} must be >= 0", f.max_queue));
  if (f.request_timeout < 0) throw CliError(fmt::format("--request-timeout {} must be >= 0 (0 = none)", f.request_timeout));
  if (f.shutdown_timeout < 0) throw CliError(fmt::format("--shutdown-timeout {} must be >= 0", f.shutdown_timeout));
  if (!(f.write_timeout >= 0.001)) throw CliError(fmt::format("--write-timeout {} must be >= 0.001", f.write_timeout));
  if (f.max_n < 1 || f.max_n > 128) throw CliError(fmt::format("--max-n {} must be in [1, 128]", f.max_n));
  if (f.max_tokens < 1) throw CliError(fmt::format("--max-tokens {} must be >= 1", f.max_tokens));
  if (f.max_prompt_tokens < 0) {
    throw CliError(fmt::format("--max-prompt-tokens {} must be >= 0 (0 = the model's context)", f.max_prompt_tokens));
  }
  if (f.max_streams < 0) throw CliError(fmt::format("--max-streams {} must be >= 0 (0 = no own cap)", f.max_streams));
  if (f.http_threads < 0) throw CliError(fmt::format("--http-threads {} must be >= 0", f.http_threads));
}

void run(const ServeFlags& f, bool pool_memory_given, bool pool_blocks_given) {
  check_flags(f, pool_memory_given, pool_blocks_given);
  auto max_body = parse_memory_size(f.max_body);
  if (!max_body.ok()) throw CliError("--max-body: " + max_body.status().message());
  if (*max_body < 1024) throw CliError(fmt::format("--max-body {} is under 1 KiB", f.max_body));
  const KvType k_type = f.kv.k_type();
  const KvType v_type = f.kv.v_type();
  const KvStorageOptions storage = f.kv.storage_options();
  // Before anything starts: re-executed once with malloc settings that keep RSS flat.
  const std::optional<std::string> malloc_warning = reexec_with_server_malloc_settings();
  // The log goes to stderr (stdout stays free for whatever wraps the server).
  spdlog::set_default_logger(spdlog::stderr_color_mt("kvlm"));
  if (f.quiet) spdlog::set_level(spdlog::level::warn);
  if (malloc_warning) spdlog::warn("{}", *malloc_warning);

  // SIGINT and SIGTERM are taken by sigwait below, so every thread started from here blocks them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  server::ServerOptions options;
  options.host = f.host;
  options.port = f.port;
  options.api_key = f.api_key;
  options.max_queue = f.max_queue;
  options.max_body_bytes = *max_body;
  options.request_timeout_seconds = f.request_timeout;
  options.write_timeout_seconds = f.write_timeout;
  options.http_threads = f.http_threads > 0 ? f.http_threads : f.max_seqs + f.max_queue + 16;
  options.log_prompts = f.log_prompts;
  options.max_streams = f.max_streams;
  options.limits.max_n = f.max_n;
  options.limits.max_tokens = f.max_tokens;
  options.limits.max_prompt_tokens = f.max_prompt_tokens;
  options.model_name = !f.alias.empty() ? f.alias
                       : f.model.empty() ? std::string("stories260K")
                                         : std::filesystem::path(f.model).stem().string();
  server::ApiServer server(options);
  const int port = value_or_throw(server.bind());
  server.start();  // /health answers 503 "loading" until the model is attached
  spdlog::info("listening on http://{}:{} (loading {})", f.host, port, model_display_name(f.model));
  if (f.host != "127.0.0.1" && f.host != "localhost" && f.host != "::1" && f.api_key.empty()) {
    spdlog::warn("serving on {} without --api-key: anyone who can reach this address can use the model", f.host);
  }

  std::unique_ptr<LlamaModel> model = load_model_or_embedded(f.model);
  ThreadPool pool(resolve_threads(f.threads));
  EngineOptions eo;
  eo.k_type = k_type;
  eo.v_type = v_type;
  eo.storage = storage;
  eo.block_size = f.block_size;
  eo.max_seqs = f.max_seqs;
  eo.max_batch_tokens = f.max_batch_tokens;
  eo.prefix_caching = !f.no_prefix_cache;
  eo.num_blocks = 1;
  {  // bytes per block come from the storage itself
    auto probe = value_or_throw(Engine::create(*model, pool, eo));
    const SlidingWindowConfig& sw = model->config().sliding_window;
    const uint64_t local_bytes =
        static_cast<uint64_t>(local_slots_needed(sw, f.block_size, f.max_seqs + Engine::kLocalSpareSequences,
                                                 f.max_batch_tokens)) *
        probe->storage().local_bytes_per_block();
    eo.num_blocks = resolve_pool_blocks(f, *model, probe->metrics().bytes_per_block, local_bytes);
  }
  auto engine = value_or_throw(Engine::create(*model, pool, eo));
  for (const std::string& warning : engine->warnings()) spdlog::warn("{}", warning);
  for (const std::string& warning : model->config().warnings) spdlog::warn("model: {}", warning);
  for (const std::string& warning : model->tokenizer().warnings()) spdlog::warn("tokenizer: {}", warning);
  auto chat_format = chat::chat_format_for_model(model->file(), model->tokenizer());
  if (!chat_format.ok()) {
    spdlog::warn("the model's chat template cannot be used ({}): /v1/chat/completions answers 400, "
                 "/v1/completions works",
                 chat_format.status().message());
  } else if (chat_format->is_fallback) {
    spdlog::warn("the model has no tokenizer.chat_template: /v1/chat/completions uses the chatml fallback");
  }
  const EngineMetrics m = engine->metrics();
  spdlog::info("model {} ({}), KV {}/{} pool {} blocks of {} tokens = {:.1f} MiB, max seqs {}, max batch tokens {}",
               options.model_name, model_display_name(f.model), kv_type_name(k_type), kv_type_name(v_type),
               eo.num_blocks, eo.block_size, m.bytes_per_block * static_cast<double>(eo.num_blocks) / (1 << 20),
               eo.max_seqs, eo.max_batch_tokens);
  engine->start();
  if (chat_format.ok()) {
    server.attach(*engine, std::move(*chat_format));
  } else {
    server.attach_without_chat(*engine, chat_format.status().message());
  }
  // Freed per-request memory goes back to the OS instead of piling up in glibc's arenas.
  HeapTrimmer heap_trimmer(std::chrono::seconds(5));
  spdlog::info("ready: http://{}:{}/v1 (Ctrl-C drains and stops)", f.host, port);
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  spdlog::info("{}: draining ({} requests in flight, up to {} s)", signal_number == SIGINT ? "SIGINT" : "SIGTERM",
               server.requests_in_flight(), f.shutdown_timeout);
  const int cancelled = server.drain(f.shutdown_timeout);
  engine->stop();
  const int leaked = engine->leaked_blocks();
  spdlog::info("stopped: {} requests cancelled at the deadline, {} blocks leaked", cancelled, leaked);
  if (leaked != 0) throw CliError(fmt::format("{} KV blocks leaked", leaked));
}

}  // namespace

CLI::App* add_serve_command(CLI::App& app) {
  auto flags = std::make_shared<ServeFlags>();
  flags->kv.both = "f16";  // a server's default: half the bytes of f32, no measurable loss
  CLI::App* cmd = app.add_subcommand("serve", "Serve the model over an OpenAI-compatible HTTP API");
  cmd->add_option("--model,-m", flags->model, "GGUF model file (default: the embedded stories260K)");
  cmd->add_option("--alias", flags->alias, "the model id clients name (default: the file's stem)");
  cmd->add_option("--host", flags->host, "address to bind (loopback unless told otherwise)")->capture_default_str();
  cmd->add_option("--port", flags->port, "port (0: any free port; the log says which)")->capture_default_str();
  cmd->add_option("--api-key", flags->api_key, "require 'Authorization: Bearer KEY' (also $KVLM_API_KEY)")
      ->envname("KVLM_API_KEY");
  flags->kv.add_to(cmd);
  const CLI::Option* pool_memory = cmd->add_option(
      "--pool-memory", flags->pool_memory,
      "KV pool size, e.g. 512MiB (default: every --max-seqs request at the full context, at most 1 GiB)");
  const CLI::Option* pool_blocks = cmd->add_option("--pool-blocks", flags->pool_blocks, "KV pool size in blocks");
  cmd->add_option("--block-size", flags->block_size, "tokens per KV block")->capture_default_str();
  cmd->add_option("--max-seqs", flags->max_seqs, "requests the engine runs at once")->capture_default_str();
  cmd->add_option("--max-batch-tokens", flags->max_batch_tokens, "tokens per engine step")->capture_default_str();
  cmd->add_option("--max-queue", flags->max_queue, "requests waiting beyond --max-seqs before 429")->capture_default_str();
  cmd->add_option("--max-body", flags->max_body, "largest request body (413 beyond)")->capture_default_str();
  cmd->add_option("--max-n", flags->max_n, "largest 'n' (parallel samples) a request may ask")->capture_default_str();
  cmd->add_option("--max-tokens", flags->max_tokens, "largest 'max_tokens' a request may ask (400 beyond)")
      ->capture_default_str();
  cmd->add_option("--max-prompt-tokens", flags->max_prompt_tokens,
                  "longest prompt in tokens (400 beyond; 0 = the model's context)")
      ->capture_default_str();
  cmd->add_option("--max-streams", flags->max_streams,
                  "streaming responses at once (429 beyond; 0 = only --max-queue bounds them)")
      ->capture_default_str();
  cmd->add_option("--request-timeout", flags->request_timeout, "seconds a request may run (0 = none)")
      ->capture_default_str();
  cmd->add_option("--shutdown-timeout", flags->shutdown_timeout,
                  "seconds SIGINT/SIGTERM waits for in-flight requests before cancelling them")
      ->capture_default_str();
  cmd->add_option("--write-timeout", flags->write_timeout,
                  "seconds a client may accept no bytes (stopped reading) before its request is cancelled")
      ->capture_default_str();
  cmd->add_option("--threads,-t", flags->threads, "compute threads (default: all cores)");
  cmd->add_option("--http-threads", flags->http_threads,
                  "HTTP worker threads; a streaming response holds one (default: max-seqs + max-queue + 16)");
  cmd->add_flag("--no-prefix-cache", flags->no_prefix_cache, "do not share cached prompt blocks across requests");
  cmd->add_flag("--log-prompts", flags->log_prompts, "include prompt text in the request log");
  cmd->add_flag("--quiet,-q", flags->quiet, "log warnings and errors only");
  cmd->callback([flags, pool_memory, pool_blocks] {
    run(*flags, pool_memory->count() > 0, pool_blocks->count() > 0);
  });
  return cmd;
}

}  // namespace kvlm::cli
