// Request: what a client submits to the Engine and the events it gets back.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/ids.h"
#include "engine/sampler.h"
#include "evict/eviction_options.h"
#include "evict/evicting_sequence.h"

namespace kvlm {

using RequestId = StrongId<struct RequestIdTag>;

enum class FinishReason {
  kNone,       // still generating (a token event)
  kStop,       // EOS, a stop token or a stop string
  kLength,     // max_tokens reached, or the model's context is full
  kCancelled,  // cancel(id)
  kError,      // the request could not continue (TokenEvent::error says why)
};
const char* finish_reason_name(FinishReason reason);  // "stop", "length", "cancelled", "error"

// Which logits rows a request's events carry (tests, `kvlm run --verify`); costs a copy.
enum class LogitsCapture {
  kNone,
  kSampled,  // the row each token was sampled from
  kAll,      // every forwarded token's row, in token order (prefill rows too)
};

struct RequestOptions {
  // The prompt as token ids; when empty, `prompt_text` is encoded (BOS added when the
  // vocabulary asks for it; special tokens parsed when parse_special).
  std::vector<TokenId> prompt;
  std::string prompt_text;
  bool parse_special = false;
  SamplerParams sampler;       // each request has its own generator: batching never changes its draws
  int max_tokens = 256;        // new tokens; 0 = until a stop or the context is full
  bool stop_at_eos = true;     // EOS (or BOS appearing mid-stream) ends generation
  std::vector<TokenId> stop_tokens;
  std::vector<std::string> stop_strings;  // text never includes the stop string itself
  EvictionOptions eviction;    // per-request policy and budget in the engine's one pool
  int priority = 0;            // higher runs first and is preempted last
  std::string cache_salt;      // requests with different salts never share cached blocks
  LogitsCapture logits = LogitsCapture::kNone;
};

// Measured over a request's life; complete in its last event.
struct RequestStats {
  int prompt_tokens = 0;
  int cached_prompt_tokens = 0;  // prompt tokens the prefix cache supplied at first admission
  int completion_tokens = 0;
  int preemptions = 0;
  double time_to_first_token = 0;   // seconds from submit to the first generated token
  double total_seconds = 0;         // submit to finish
  double mean_inter_token = 0;      // seconds between generated tokens (0 with fewer than 2)
  std::vector<double> inter_token;  // every gap, in order
  EvictionStats eviction;           // what the policy evicted (at the last time it ran)
  int peak_blocks = 0;              // most blocks the request held at once
  int live_tokens = 0;              // tokens attention saw when its sequence was last released
};

// One event per generated token, and a last one with finish != kNone (which may carry a final
// token, or none: token < 0). `text` is valid UTF-8: bytes of an incomplete character wait for
// the token that completes them; stop strings are cut off.
struct TokenEvent {
  RequestId id;
  TokenId token = -1;
  std::string text;
  FinishReason finish = FinishReason::kNone;
  std::string error;             // with kError
  const RequestStats* stats = nullptr;     // with the last event
  const std::vector<float>* logits = nullptr;  // captured rows since the last event ([rows, vocab])
};

// Called on the engine's stepping thread; must not call back into the engine's step().
using TokenCallback = std::function<void(const TokenEvent&)>;

}  // namespace kvlm
