#include "server/generation_session.h"

#include "model/llama_model.h"
#include "model/tokenizer.h"

namespace kvlm::server {

GenerationSession::GenerationSession(Engine& engine, RequestOptions request, int num_choices, int num_logprobs)
    : engine_(engine), request_(std::move(request)), num_choices_(num_choices), num_logprobs_(num_logprobs),
      ids_(num_choices) {
  if (num_logprobs_ >= 0) request_.logits = LogitsCapture::kSampled;
}

Status GenerationSession::start() {
  auto id = engine_.submit(request_, callback_for(0));
  if (!id.ok()) return id.status();
  std::lock_guard<std::mutex> lock(mutex_);
  ids_[0] = *id;
  return Status::ok_status();
}

TokenCallback GenerationSession::callback_for(int choice) {
  // The session outlives every engine request it submitted: the callbacks hold it.
  auto self = shared_from_this();
  return [self, choice](const TokenEvent& event) { self->on_event(choice, event); };
}

void GenerationSession::on_event(int choice, const TokenEvent& event) {
  ChoiceEvent out;
  out.choice = choice;
  out.token = event.token;
  out.text = event.text;
  out.finish = event.finish;
  out.error = event.error;
  if (event.stats != nullptr) out.stats = *event.stats;
  if (num_logprobs_ >= 0 && event.token >= 0 && event.logits != nullptr && !event.logits->empty()) {
    const Tokenizer& tokenizer = engine_.model().tokenizer();
    const size_t vocab = static_cast<size_t>(tokenizer.vocab_size());
    // The last captured row is the one this token was sampled from.
    const size_t rows = event.logits->size() / vocab;
    std::span<const float> row(event.logits->data() + (rows - 1) * vocab, vocab);
    out.logprobs = token_logprobs(row, event.token, num_logprobs_, tokenizer);
  }
  push(std::move(out));
  if (choice == 0) submit_remaining_choices();
}

void GenerationSession::submit_remaining_choices() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (others_submitted_ || num_choices_ == 1) return;
    others_submitted_ = true;
  }
  for (int choice = 1; choice < num_choices_; ++choice) {
    bool cancelled = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      cancelled = cancelled_;
    }
    if (cancelled) {
      ChoiceEvent last;
      last.choice = choice;
      last.finish = FinishReason::kCancelled;
      push(std::move(last));
      continue;
    }
    RequestOptions options = request_;
    options.sampler.seed = request_.sampler.seed + static_cast<uint64_t>(choice);
    auto id = engine_.submit(std::move(options), callback_for(choice));
    if (!id.ok()) {
      ChoiceEvent failed;
      failed.choice = choice;
      failed.finish = FinishReason::kError;
      failed.error = id.status().message();
      push(std::move(failed));
      continue;
    }
    bool cancel_now = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ids_[choice] = *id;
      cancel_now = cancelled_;  // cancel() ran while this one was being submitted
    }
    if (cancel_now) engine_.cancel(*id);
  }
}

void GenerationSession::push(ChoiceEvent event) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (event.finish != FinishReason::kNone) ++num_finished_;
    events_.push_back(std::move(event));
  }
  ready_.notify_all();
}

std::optional<ChoiceEvent> GenerationSession::next_event(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!ready_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
  ChoiceEvent event = std::move(events_.front());
  events_.pop_front();
  return event;
}

void GenerationSession::cancel() {
  std::vector<RequestId> to_cancel;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cancelled_ = true;
    for (const auto& id : ids_) {
      if (id) to_cancel.push_back(*id);
    }
  }
  for (RequestId id : to_cancel) engine_.cancel(id);  // false for finished ones: harmless
}

bool GenerationSession::all_finished() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return num_finished_ == num_choices_;
}

}  // namespace kvlm::server
