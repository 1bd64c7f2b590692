#include "server/request_log.h"

#include <spdlog/spdlog.h>

namespace kvlm::server {

RequestLog& request_log() {
  thread_local RequestLog log;
  return log;
}

void RequestLog::begin() {
  *this = RequestLog();
  start = std::chrono::steady_clock::now();
}

void RequestLog::finish(const std::string& method, const std::string& path, int status, bool log_prompts) {
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::string line = fmt::format("{} {} {}", method, path, status);
  if (prompt_tokens >= 0) {
    line += fmt::format(" prompt={} cached={} completion={}", prompt_tokens, cached_tokens, completion_tokens);
    if (time_to_first_token >= 0) line += fmt::format(" ttft={:.3f}s", time_to_first_token);
  }
  line += fmt::format(" total={:.3f}s", total);
  if (!note.empty()) line += " (" + note + ")";
  if (log_prompts && !prompt.empty()) line += fmt::format(" prompt_text={:?}", prompt);
  spdlog::info("{}", line);
}

}  // namespace kvlm::server
