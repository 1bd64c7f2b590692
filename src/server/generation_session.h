// GenerationSession: one HTTP generation request's choices in the engine, and the queue that
// carries their events from the engine's thread to the HTTP thread that answers the client.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/request.h"
#include "server/token_logprobs.h"

namespace kvlm::server {

struct ChoiceEvent {
  int choice = 0;
  TokenId token = -1;
  std::string text;
  FinishReason finish = FinishReason::kNone;
  std::string error;
  std::optional<RequestStats> stats;          // with the last event
  std::optional<TokenLogprobs> logprobs;      // when requested and a token was sampled
};

// Choices share the prompt's blocks: choice 0 is submitted first and the others when its first
// event arrives, by which time its prompt blocks are published, so they attach them from the
// prefix cache instead of computing the prompt n times.
class GenerationSession : public std::enable_shared_from_this<GenerationSession> {
 public:
  // `request` is choice 0's; choice i draws with seed + i. num_logprobs < 0: none.
  GenerationSession(Engine& engine, RequestOptions request, int num_choices, int num_logprobs);

  // Submits choice 0; the error of Engine::submit when it refuses.
  Status start();
  // The next event, or nullopt when `timeout` passed first.
  std::optional<ChoiceEvent> next_event(std::chrono::milliseconds timeout);
  // Cancels every choice still running (client gone, timeout, shutdown); their last events
  // still arrive. Idempotent.
  void cancel();
  bool all_finished() const;
  int num_choices() const { return num_choices_; }

 private:
  TokenCallback callback_for(int choice);
  void on_event(int choice, const TokenEvent& event);
  void submit_remaining_choices();  // on choice 0's first event
  void push(ChoiceEvent event);

  Engine& engine_;
  RequestOptions request_;
  const int num_choices_;
  const int num_logprobs_;

  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<ChoiceEvent> events_;
  std::vector<std::optional<RequestId>> ids_;  // per choice, once submitted
  int num_finished_ = 0;
  bool cancelled_ = false;
  bool others_submitted_ = false;
};

}  // namespace kvlm::server
