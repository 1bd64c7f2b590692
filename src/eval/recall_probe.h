// Recall probe: can a detail shown `distance` tokens ago still be retrieved? Accuracy against distance.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/ids.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "eval/eval_sequence_cache.h"

namespace kvlm {

class LlamaModel;
class Tokenizer;

enum class RecallMode {
  // [BOS] A filler A with A a span of random ordinary tokens: teacher-forced top-1 accuracy on
  // the second copy's tokens 2..L (token 1 cannot be inferred). Works on tiny trained models,
  // whose induction heads copy what followed the previous occurrence of the current token.
  // The control replaces the first A by a span B sharing no token with A: what the model gets
  // right without the first copy (its prior), so accuracy minus control is retrieval.
  kRepeat,
  // An instruction naming a random 5-digit pass key, filler to the distance, then "What is the
  // pass key? The pass key is" and greedy decoding: accuracy = the 5 digits recovered exactly.
  kPasskey,
};

// Where repeat mode's spans come from.
enum class SpanSource {
  kRandomTokens,  // distinct random ordinary tokens: pure copying, nothing to guess from
  kText,          // L consecutive tokens of the filler text at a random offset: what tiny story
                  // models copy (they learned induction on names and phrases, not on noise);
                  // the control's prior is then high, and retrieval is accuracy minus control
};

// Whether prompts may run past the context limit.
enum class PastContext { kRefuse, kAllow };

struct RecallOptions {
  RecallMode mode = RecallMode::kRepeat;
  std::vector<int> distances = {0, 64, 128, 256, 512, 1024};  // filler tokens between the copies
  int trials = 20;
  int span = 32;                  // L: tokens per span (repeat mode)
  SpanSource span_source = SpanSource::kRandomTokens;
  std::vector<TokenId> filler;    // filler text tokens (no BOS); empty: random ordinary tokens
                                  // (repeat) or built-in filler sentences (passkey)
  uint64_t seed = 1;
  int chunk = 256;                // tokens per forward
  int context_limit = 0;          // longest prompt allowed; 0 = the GGUF's context_length
  PastContext past_context = PastContext::kRefuse;
  int passkey_max_new_tokens = 12;
  EvalCacheOptions cache;
  EvalCacheFactory make_cache;    // empty: the full cache, sized for the longest prompt
};

struct RecallPoint {
  int distance = 0;
  int64_t prompt_tokens = 0;      // tokens per trial prompt (passkey: before decoding)
  bool past_context = false;      // prompts run past context_limit (only with PastContext::kAllow)
  int num_trials = 0;
  double accuracy = 0;            // mean over trials of each trial's accuracy
  double accuracy_stderr = 0;     // sample standard deviation over trials / sqrt(trials)
  double control_accuracy = 0;    // repeat: the control span's accuracy; passkey: 0
  double control_stderr = 0;
  double digit_accuracy = 0;      // passkey: share of the 5 digits right, position by position
};

struct RecallResult {
  RecallMode mode = RecallMode::kRepeat;
  int span = 0;
  int trials = 0;
  int context_limit = 0;
  int num_candidates = 0;         // repeat: ordinary tokens spans are drawn from
  double chance = 0;              // top-1 chance level: 1 / num_candidates (passkey: 1e-5)
  std::vector<RecallPoint> points;
  uint64_t kv_bytes_peak = 0;
  double seconds = 0;
};

// Runs every trial at every distance. Errors: no distances, a negative distance, trials < 1,
// span < 2 (repeat) or more than half the candidates, a filler text shorter than the largest
// distance, prompts past the context limit without PastContext::kAllow (naming the lengths).
Result<RecallResult> run_recall_probe(LlamaModel& model, ThreadPool& pool, const RecallOptions& options);

// --- The pieces, public so that tests and report generators can check them. ---

// Ordinary text tokens: normal (or undefined) types, not BOS/EOS/UNK/PAD, not byte pieces.
std::vector<TokenId> recall_candidate_tokens(const Tokenizer& tokenizer);

// One trial's random material, drawn from (seed, trial) only, so trial t is the same at every
// distance: the probe span, a control span disjoint from it, and max_distance filler tokens
// (a window of the filler text at a random offset, or random candidates when it is empty).
// With SpanSource::kText the spans are windows of the filler text too (not disjoint).
struct RepeatTrial {
  std::vector<TokenId> probe;    // [span] distinct tokens
  std::vector<TokenId> control;  // [span] distinct tokens, none in probe
  std::vector<TokenId> filler;   // [max_distance]
};
Result<RepeatTrial> make_repeat_trial(std::span<const TokenId> candidates, std::span<const TokenId> filler_text,
                                      int span, int max_distance, uint64_t seed, int trial,
                                      SpanSource source = SpanSource::kRandomTokens);

// [BOS] first filler[0, distance) second: the positions the scorer reads.
struct RepeatPrompt {
  std::vector<TokenId> tokens;
  int64_t first_begin = 0;   // position of the first span's first token
  int64_t second_begin = 0;  // position of the second span's first token
  int span = 0;
};
RepeatPrompt build_repeat_prompt(TokenId bos, std::span<const TokenId> first, std::span<const TokenId> filler,
                                 int distance, std::span<const TokenId> second);

// Feeds the prompt through `cache` (reset first) and returns the teacher-forced top-1 accuracy
// on the second span's tokens 2..L: the rows at second_begin + i, i in [0, L - 1), each scored
// against token second_begin + i + 1. Ties go to the lowest id.
double score_repeat(EvalSequenceCache& cache, const RepeatPrompt& prompt, int vocab_size, int chunk);

// Passkey pieces: the prompt around a key, and the digits a decoded answer gives back.
struct PasskeyPrompt {
  std::vector<TokenId> tokens;
  std::string key;          // 5 digits
  int64_t filler_begin = 0;  // position of the first filler token
};
PasskeyPrompt build_passkey_prompt(const Tokenizer& tokenizer, const std::string& key,
                                   std::span<const TokenId> filler, int distance);
// Position-wise matches between the first run of digits in `answer` and `key` (0..key.size()).
int passkey_digits_matched(const std::string& answer, const std::string& key);

}  // namespace kvlm
