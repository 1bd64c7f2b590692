#include "demo_server.h"

#include <cstdio>
#include <string>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "chat/chat_format.h"
#include "cli_error.h"
#include "engine/engine.h"
#include "model/llama_model.h"
#include "server/api_server.h"

namespace kvlm::cli {

using nlohmann::json;

bool demo_server(LlamaModel& model, ThreadPool& pool) {
  EngineOptions eo;
  eo.k_type = eo.v_type = KvType::kF16;
  eo.num_blocks = 256;
  auto engine = value_or_throw(Engine::create(model, pool, eo));
  auto format = chat::chat_format_for_model(model.file(), model.tokenizer());
  if (!format.ok()) throw CliError("the model's chat template: " + format.status().message());
  // The server's request log would interleave with the demo's own lines.
  const spdlog::level::level_enum log_level = spdlog::get_level();
  spdlog::set_level(spdlog::level::warn);
  server::ServerOptions so;
  so.port = 0;
  so.model_name = "stories260K";
  so.http_threads = 4;
  server::ApiServer server(so);
  const int port = value_or_throw(server.bind());
  server.start();
  engine->start();
  server.attach(*engine, std::move(*format));

  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(30, 0);
  const json body = {{"model", "stories260K"},
                     {"messages", {{{"role", "user"}, {"content", "Tell me a story about a cat and a dog."}}}},
                     {"max_tokens", 32},
                     {"temperature", 0}};
  std::printf("\nserver   kvlm serve's OpenAI API, here in this process on http://127.0.0.1:%d\n", port);
  bool ok = true;
  json first;
  for (int i = 0; i < 2 && ok; ++i) {
    auto res = client.Post("/v1/chat/completions", body.dump(), "application/json");
    if (!res || res->status != 200) {
      std::printf("         POST /v1/chat/completions failed (%s)\n",
                  res ? std::to_string(res->status).c_str() : httplib::to_string(res.error()).c_str());
      ok = false;
      break;
    }
    const json r = json::parse(res->body);
    const json& u = r["usage"];
    if (i == 0) {
      first = r;
      std::string text = r["choices"][0]["message"]["content"];
      for (char& ch : text) {
        if (ch == '\n') ch = ' ';
      }
      std::printf("         POST /v1/chat/completions -> %d, %d tokens: \"%s\"\n", res->status,
                  u["completion_tokens"].get<int>(), text.c_str());
    } else {
      const int cached = u["prompt_tokens_details"]["cached_tokens"];
      std::printf("         the same request again -> %d, %d of its %d prompt tokens from the prefix cache, "
                  "same reply: %s\n",
                  res->status, cached, u["prompt_tokens"].get<int>(),
                  r["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"] ? "yes" : "NO");
      ok = cached > 0 && r["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"];
    }
  }
  auto metrics = client.Get("/metrics");
  if (metrics && metrics->status == 200) {
    const std::string key = "kvlm:prefix_cache_hits_total{model_name=\"stories260K\"} ";
    const size_t at = metrics->body.find(key);
    if (at != std::string::npos) {
      std::printf("         GET /metrics -> %s%s", key.c_str(),
                  metrics->body.substr(at + key.size(), metrics->body.find('\n', at) - at - key.size() + 1).c_str());
    }
  } else {
    ok = false;
  }
  server.drain(1.0);
  engine->stop();
  spdlog::set_level(log_level);
  if (engine->leaked_blocks() != 0) ok = false;
  std::printf("try it   build/kvlm serve   (then the curl and openai examples in the README)\n");
  return ok;
}

}  // namespace kvlm::cli
