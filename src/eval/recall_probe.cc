#include "eval/recall_probe.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include <fmt/format.h>

#include "core/check.h"
#include "core/rng.h"
#include "model/llama_model.h"
#include "model/tokenizer.h"

namespace kvlm {
namespace {

// Trial streams never overlap for different trials or modes of the same seed.
Rng trial_rng(uint64_t seed, int trial, uint64_t stream) {
  return Rng(seed * 0x100000001b3ull + static_cast<uint64_t>(trial) * 0x9e3779b97f4a7c15ull + stream);
}

int64_t uniform(Rng& rng, int64_t n) {
  return static_cast<int64_t>(rng.next_double() * static_cast<double>(n)) % std::max<int64_t>(n, 1);
}

// Mean and standard error (sample standard deviation / sqrt(n)) of per-trial values.
std::pair<double, double> mean_and_stderr(const std::vector<double>& x) {
  if (x.empty()) return {0, 0};
  double sum = 0;
  for (double v : x) sum += v;
  const double n = static_cast<double>(x.size());
  const double mean = sum / n;
  if (x.size() < 2) return {mean, 0};
  double sq = 0;
  for (double v : x) sq += (v - mean) * (v - mean);
  return {mean, std::sqrt(sq / (n - 1) / n)};
}

TokenId argmax_row(std::span<const float> row) {
  return static_cast<TokenId>(std::max_element(row.begin(), row.end()) - row.begin());
}

// Feeds tokens [begin, end) of `tokens` in chunks; rows are requested only where wanted.
void feed(EvalSequenceCache& cache, std::span<const TokenId> tokens, int64_t begin, int64_t end, int chunk,
          LogitsRows rows, std::vector<float>& logits) {
  for (int64_t pos = begin; pos < end;) {
    const int64_t stop = std::min(end, pos + chunk);
    cache.forward(tokens.subspan(static_cast<size_t>(pos), static_cast<size_t>(stop - pos)), rows, logits);
    pos = stop;
  }
}

constexpr const char* kPasskeyIntro =
    "There is an important pass key hidden inside a lot of irrelevant text. Find it and remember it. "
    "The pass key is {}. Remember it. {} is the pass key.";
constexpr const char* kPasskeyQuestion = " What is the pass key? The pass key is";
constexpr const char* kPasskeyFiller =
    " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
constexpr int kPasskeyDigits = 5;

}  // namespace

std::vector<TokenId> recall_candidate_tokens(const Tokenizer& tokenizer) {
  const TokenizerVocab& v = tokenizer.vocab();
  std::vector<TokenId> out;
  for (TokenId id = 0; id < tokenizer.vocab_size(); ++id) {
    const TokenType type = tokenizer.token_type(id);
    if (type != TokenType::kNormal && type != TokenType::kUndefined) continue;
    if (id == v.bos_id || id == v.eos_id || id == v.unk_id || id == v.pad_id) continue;
    if (tokenizer.token_to_piece(id).empty()) continue;
    out.push_back(id);
  }
  return out;
}

Result<RepeatTrial> make_repeat_trial(std::span<const TokenId> candidates, std::span<const TokenId> filler_text,
                                      int span, int max_distance, uint64_t seed, int trial,
                                      SpanSource source) {
  if (source == SpanSource::kText) {
    if (span < 1 || static_cast<int64_t>(filler_text.size()) < std::max(max_distance, span)) {
      return Status::errorf("text spans of {} tokens and distance {} need a filler text of at least {} tokens; it has {}",
                            span, max_distance, std::max(max_distance, span), filler_text.size());
    }
    Rng rng = trial_rng(seed, trial, 3);
    const auto window = [&](int64_t n) {
      const int64_t offset = uniform(rng, static_cast<int64_t>(filler_text.size()) - n + 1);
      return std::vector<TokenId>(filler_text.begin() + offset, filler_text.begin() + offset + n);
    };
    RepeatTrial t;
    t.probe = window(span);
    t.control = window(span);
    t.filler = window(max_distance);
    return t;
  }
  if (span < 1 || 2 * static_cast<int64_t>(span) > static_cast<int64_t>(candidates.size())) {
    return Status::errorf("--span {} needs 2 x {} distinct ordinary tokens; the vocabulary has {}", span, span,
                          candidates.size());
  }
  if (!filler_text.empty() && static_cast<int64_t>(filler_text.size()) < max_distance) {
    return Status::errorf("the filler text has {} tokens; distance {} needs at least {}", filler_text.size(),
                          max_distance, max_distance);
  }
  Rng rng = trial_rng(seed, trial, 1);
  // A partial Fisher-Yates shuffle: the first 2L entries are distinct, split into probe and control.
  std::vector<TokenId> pool(candidates.begin(), candidates.end());
  for (int i = 0; i < 2 * span; ++i) {
    const int64_t j = i + uniform(rng, static_cast<int64_t>(pool.size()) - i);
    std::swap(pool[static_cast<size_t>(i)], pool[static_cast<size_t>(j)]);
  }
  RepeatTrial t;
  t.probe.assign(pool.begin(), pool.begin() + span);
  t.control.assign(pool.begin() + span, pool.begin() + 2 * span);
  if (filler_text.empty()) {
    t.filler.resize(static_cast<size_t>(max_distance));
    for (TokenId& id : t.filler) id = candidates[static_cast<size_t>(uniform(rng, static_cast<int64_t>(candidates.size())))];
  } else {
    const int64_t offset = uniform(rng, static_cast<int64_t>(filler_text.size()) - max_distance + 1);
    t.filler.assign(filler_text.begin() + offset, filler_text.begin() + offset + max_distance);
  }
  return t;
}

RepeatPrompt build_repeat_prompt(TokenId bos, std::span<const TokenId> first, std::span<const TokenId> filler,
                                 int distance, std::span<const TokenId> second) {
  KVLM_CHECK(first.size() == second.size(), "spans of {} and {} tokens", first.size(), second.size());
  KVLM_CHECK(distance >= 0 && static_cast<size_t>(distance) <= filler.size(), "distance {} with {} filler tokens",
             distance, filler.size());
  RepeatPrompt p;
  p.span = static_cast<int>(first.size());
  if (bos >= 0) p.tokens.push_back(bos);
  p.first_begin = static_cast<int64_t>(p.tokens.size());
  p.tokens.insert(p.tokens.end(), first.begin(), first.end());
  p.tokens.insert(p.tokens.end(), filler.begin(), filler.begin() + distance);
  p.second_begin = static_cast<int64_t>(p.tokens.size());
  p.tokens.insert(p.tokens.end(), second.begin(), second.end());
  return p;
}

double score_repeat(EvalSequenceCache& cache, const RepeatPrompt& prompt, int vocab_size, int chunk) {
  KVLM_CHECK(prompt.span >= 2, "span {} leaves nothing to score", prompt.span);
  KVLM_CHECK(chunk >= 1, "chunk {}", chunk);
  const std::span<const TokenId> tokens(prompt.tokens);
  const size_t vocab = static_cast<size_t>(vocab_size);
  std::vector<float> logits;  // [rows, vocab]
  cache.reset();
  // Rows before the second span are not scored: only the last row of each chunk is computed.
  feed(cache, tokens, 0, prompt.second_begin, chunk, LogitsRows::kLast, logits);
  int correct = 0;
  const int64_t end = prompt.second_begin + prompt.span - 1;  // the last token is only a target
  for (int64_t pos = prompt.second_begin; pos < end;) {
    const int64_t stop = std::min(end, pos + chunk);
    cache.forward(tokens.subspan(static_cast<size_t>(pos), static_cast<size_t>(stop - pos)), LogitsRows::kAll,
                  logits);
    KVLM_CHECK(logits.size() == static_cast<size_t>(stop - pos) * vocab, "{} logits for {} rows", logits.size(),
               stop - pos);
    for (int64_t p = pos; p < stop; ++p) {
      const TokenId predicted = argmax_row(std::span<const float>(logits).subspan(static_cast<size_t>(p - pos) * vocab, vocab));
      if (predicted == tokens[static_cast<size_t>(p + 1)]) ++correct;
    }
    pos = stop;
  }
  return static_cast<double>(correct) / static_cast<double>(prompt.span - 1);
}

PasskeyPrompt build_passkey_prompt(const Tokenizer& tokenizer, const std::string& key,
                                   std::span<const TokenId> filler, int distance) {
  KVLM_CHECK(distance >= 0 && static_cast<size_t>(distance) <= filler.size(), "distance {} with {} filler tokens",
             distance, filler.size());
  PasskeyPrompt p;
  p.key = key;
  p.tokens = tokenizer.encode(fmt::format(fmt::runtime(kPasskeyIntro), key, key), tokenizer.add_bos());
  p.filler_begin = static_cast<int64_t>(p.tokens.size());
  p.tokens.insert(p.tokens.end(), filler.begin(), filler.begin() + distance);
  const std::vector<TokenId> question = tokenizer.encode(kPasskeyQuestion, false);
  p.tokens.insert(p.tokens.end(), question.begin(), question.end());
  return p;
}

int passkey_digits_matched(const std::string& answer, const std::string& key) {
  const auto first = std::find_if(answer.begin(), answer.end(), [](char c) { return c >= '0' && c <= '9'; });
  const auto last = std::find_if(first, answer.end(), [](char c) { return c < '0' || c > '9'; });
  const std::string digits(first, last);
  int matched = 0;
  for (size_t i = 0; i < std::min(digits.size(), key.size()); ++i) matched += digits[i] == key[i] ? 1 : 0;
  return matched;
}

Result<RecallResult> run_recall_probe(LlamaModel& model, ThreadPool& pool, const RecallOptions& options) {
  const ModelConfig& config = model.config();
  const Tokenizer& tok = model.tokenizer();
  if (options.distances.empty()) return Status::errorf("--distances lists no distance");
  for (int d : options.distances) {
    if (d < 0) return Status::errorf("--distances: distance {} must be >= 0", d);
  }
  if (options.trials < 1) return Status::errorf("--trials {} must be at least 1", options.trials);
  if (options.chunk < 1) return Status::errorf("--chunk {} must be at least 1", options.chunk);
  if (options.context_limit < 0) return Status::errorf("context limit {} must be >= 0", options.context_limit);
  if (options.mode == RecallMode::kRepeat && options.span < 2) {
    return Status::errorf("--span {} must be at least 2 (the second copy's first token cannot be inferred)",
                          options.span);
  }
  for (TokenId id : options.filler) {
    if (id < 0 || id >= config.vocab_size) return Status::errorf("filler token {} is outside the vocabulary", id);
  }
  const int max_distance = *std::max_element(options.distances.begin(), options.distances.end());

  RecallResult result;
  result.mode = options.mode;
  result.span = options.mode == RecallMode::kRepeat ? options.span : kPasskeyDigits;
  result.trials = options.trials;
  result.context_limit = options.context_limit > 0 ? options.context_limit : config.context_length;

  // Prompt lengths depend on the distance only: check them all before running anything.
  const std::vector<TokenId> candidates = recall_candidate_tokens(tok);
  result.num_candidates = static_cast<int>(candidates.size());
  std::vector<TokenId> passkey_filler;  // [>= max_distance] built-in sentences when no text is given
  int64_t fixed_tokens = 0;             // prompt tokens besides the filler
  if (options.mode == RecallMode::kRepeat) {
    fixed_tokens = (tok.bos_id() >= 0 ? 1 : 0) + 2 * static_cast<int64_t>(options.span);
    result.chance = candidates.empty() ? 0 : 1.0 / static_cast<double>(candidates.size());
  } else {
    if (options.filler.empty()) {
      const std::vector<TokenId> sentence = tok.encode(kPasskeyFiller, false);
      if (sentence.empty()) return Status::errorf("the tokenizer encodes the filler sentences as nothing");
      while (static_cast<int>(passkey_filler.size()) < max_distance) {
        passkey_filler.insert(passkey_filler.end(), sentence.begin(), sentence.end());
      }
    } else if (static_cast<int>(options.filler.size()) < max_distance) {
      return Status::errorf("the filler text has {} tokens; distance {} needs at least {}", options.filler.size(),
                            max_distance, max_distance);
    }
    fixed_tokens = static_cast<int64_t>(build_passkey_prompt(tok, "00000", {}, 0).tokens.size()) +
                   options.passkey_max_new_tokens;
    result.chance = 1e-5;
  }
  const int64_t longest = fixed_tokens + max_distance;
  if (longest > result.context_limit && options.past_context == PastContext::kRefuse) {
    return Status::errorf(
        "distance {} needs prompts of {} tokens ({} besides the filler), past the context of {}; lower the "
        "distance or allow it with --allow-past-context",
        max_distance, longest, fixed_tokens, result.context_limit);
  }

  EvalCacheRequest request;
  request.options = options.cache;
  request.max_tokens = longest;
  KVLM_ASSIGN_OR_RETURN(std::unique_ptr<EvalSequenceCache> cache,
                        make_eval_cache(options.make_cache, model, pool, request));

  const auto start = std::chrono::steady_clock::now();
  std::vector<RepeatTrial> trials;
  if (options.mode == RecallMode::kRepeat) {
    for (int t = 0; t < options.trials; ++t) {
      KVLM_ASSIGN_OR_RETURN(RepeatTrial trial,
                            make_repeat_trial(candidates, options.filler, options.span, max_distance, options.seed, t,
                                              options.span_source));
      trials.push_back(std::move(trial));
    }
  }
  std::vector<float> logits;  // [1, vocab] while decoding
  for (int d : options.distances) {
    RecallPoint point;
    point.distance = d;
    point.num_trials = options.trials;
    point.prompt_tokens = fixed_tokens + d - (options.mode == RecallMode::kPasskey ? options.passkey_max_new_tokens : 0);
    point.past_context = fixed_tokens + d > result.context_limit;
    std::vector<double> acc, control, digits;
    for (int t = 0; t < options.trials; ++t) {
      if (options.mode == RecallMode::kRepeat) {
        const RepeatTrial& trial = trials[static_cast<size_t>(t)];
        const RepeatPrompt probe = build_repeat_prompt(tok.bos_id(), trial.probe, trial.filler, d, trial.probe);
        acc.push_back(score_repeat(*cache, probe, config.vocab_size, options.chunk));
        result.kv_bytes_peak = std::max(
            result.kv_bytes_peak, static_cast<uint64_t>(cache->peak_blocks_held()) * cache->bytes_per_block());
        const RepeatPrompt ctl = build_repeat_prompt(tok.bos_id(), trial.control, trial.filler, d, trial.probe);
        control.push_back(score_repeat(*cache, ctl, config.vocab_size, options.chunk));
        continue;
      }
      Rng rng = trial_rng(options.seed, t, 2);
      const std::string key = fmt::format("{:05d}", uniform(rng, 90000) + 10000);
      std::span<const TokenId> filler(passkey_filler);
      if (!options.filler.empty()) {
        const int64_t offset = uniform(rng, static_cast<int64_t>(options.filler.size()) - max_distance + 1);
        filler = std::span<const TokenId>(options.filler).subspan(static_cast<size_t>(offset));
      }
      const PasskeyPrompt prompt = build_passkey_prompt(tok, key, filler, d);
      cache->reset();
      feed(*cache, prompt.tokens, 0, static_cast<int64_t>(prompt.tokens.size()), options.chunk, LogitsRows::kLast,
           logits);
      std::string answer;
      for (int i = 0; i < options.passkey_max_new_tokens; ++i) {
        const TokenId next = argmax_row(logits);
        if (next == tok.eos_id()) break;
        answer += tok.token_to_piece(next);
        // Stop once a run of digits has ended: the answer is complete.
        const auto digit = [](char c) { return c >= '0' && c <= '9'; };
        if (std::any_of(answer.begin(), answer.end(), digit) && !digit(answer.back())) break;
        if (i + 1 < options.passkey_max_new_tokens) cache->forward(std::span<const TokenId>(&next, 1), LogitsRows::kLast, logits);
      }
      result.kv_bytes_peak = std::max(
          result.kv_bytes_peak, static_cast<uint64_t>(cache->peak_blocks_held()) * cache->bytes_per_block());
      const int matched = passkey_digits_matched(answer, key);
      acc.push_back(matched == kPasskeyDigits ? 1.0 : 0.0);
      digits.push_back(static_cast<double>(matched) / kPasskeyDigits);
    }
    std::tie(point.accuracy, point.accuracy_stderr) = mean_and_stderr(acc);
    std::tie(point.control_accuracy, point.control_stderr) = mean_and_stderr(control);
    point.digit_accuracy = mean_and_stderr(digits).first;
    result.points.push_back(point);
  }
  cache->reset();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace kvlm
