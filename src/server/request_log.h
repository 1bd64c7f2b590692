// RequestLog: the one log line per HTTP request (method, route, status, prompt / cached /
// completion tokens, time to first token, total time), gathered on the thread that serves it.
#pragma once

#include <chrono>
#include <string>

namespace kvlm::server {

struct RequestLog {
  std::chrono::steady_clock::time_point start;
  int prompt_tokens = -1;  // -1: not a generation request
  int cached_tokens = 0;
  int completion_tokens = 0;
  double time_to_first_token = -1;
  std::string prompt;      // only logged with --log-prompts
  std::string note;        // e.g. "cancelled: client disconnected"

  void begin();
  // Writes the line through spdlog. Never logs the API key; the prompt only when asked.
  void finish(const std::string& method, const std::string& path, int status, bool log_prompts);
};

// httplib runs a request's handler, its streaming provider and its logger on one worker thread.
RequestLog& request_log();

}  // namespace kvlm::server
