#include "engine/engine.h"

#include <algorithm>
#include <new>
#include <unordered_set>

#include <fmt/format.h>

#include "core/check.h"
#include "engine/engine_request.h"
#include "gguf/gguf_file.h"
#include "model/llama_model.h"

namespace kvlm {
namespace {

double seconds_between(EngineRequest::Clock::time_point a, EngineRequest::Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Extends the request's chain hashes to cover its first `num_blocks` full blocks (each block's
// hash is computed once, when first needed: at admission or when it is published).
void extend_block_hashes(EngineRequest& r, int num_blocks, int block_size) {
  const size_t bs = static_cast<size_t>(block_size);
  while (static_cast<int>(r.block_hashes.size()) < num_blocks) {
    const size_t b = r.block_hashes.size();
    const BlockHash parent = b == 0 ? r.root : r.block_hashes[b - 1];
    r.block_hashes.push_back(chain_block_hash(parent, std::span<const TokenId>(r.tokens).subspan(b * bs, bs)));
  }
}

// Higher priority first; among equals, the earlier admission.
bool runs_before(const std::unique_ptr<EngineRequest>& a, const std::unique_ptr<EngineRequest>& b) {
  if (a->options.priority != b->options.priority) return a->options.priority > b->options.priority;
  return a->admission < b->admission;
}

}  // namespace

bool window_policy(EvictionPolicy policy) {
  return policy == EvictionPolicy::kWindow || policy == EvictionPolicy::kStreaming;
}

int request_token_limit(const ModelConfig& config, int num_prompt, int max_tokens, EvictionPolicy policy) {
  const int64_t wanted = max_tokens == 0 ? config.context_length : static_cast<int64_t>(num_prompt) + max_tokens;
  const int64_t cap = window_policy(policy) ? (int64_t{1} << 30) : config.context_length;
  return static_cast<int>(std::min<int64_t>(wanted, cap));
}

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "none";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "?";
}

Result<std::unique_ptr<Engine>> Engine::create(LlamaModel& model, ThreadPool& pool, const EngineOptions& options) {
  const ModelConfig& c = model.config();
  if (options.block_size < 1 || options.block_size > 4096) {
    return Status::errorf("--block-size {} must be in [1, 4096]", options.block_size);
  }
  if (options.num_blocks < 1) return Status::errorf("the pool needs at least one block, got {}", options.num_blocks);
  if (options.max_batch_tokens < 1) {
    return Status::errorf("--max-batch-tokens {} must be >= 1", options.max_batch_tokens);
  }
  if (options.max_seqs < 1) return Status::errorf("--max-seqs {} must be >= 1", options.max_seqs);
  const KvLayout layout = c.kv_layout(options.block_size);
  KvStorageOptions storage_options = options.storage;
  EngineOptions engine_options = options;
  std::vector<std::string> warnings;
  if (c.sliding_window.any()) {
    // Local layers keep only the windows of the running sequences, and spare ones.
    keep_local_windows(c.sliding_window, options.block_size, options.max_seqs + kLocalSpareSequences,
                       options.max_batch_tokens, options.num_blocks, storage_options);
  }
  KVLM_ASSIGN_OR_RETURN(std::unique_ptr<KvStorage> storage,
                        KvStorage::create(layout, options.k_type, options.v_type, options.num_blocks, storage_options));
  std::unique_ptr<Engine> engine(new Engine(model, pool, engine_options, std::move(storage)));
  engine->warnings_ = std::move(warnings);
  return engine;
}

Engine::Engine(LlamaModel& model, ThreadPool& pool, const EngineOptions& options, std::unique_ptr<KvStorage> storage)
    : model_(model),
      pool_(pool),
      options_(options),
      storage_(std::move(storage)),
      cache_(options.num_blocks, options.block_size, options.faults.get()) {
  // Everything that changes a block's bytes for the same tokens: a hit must never cross it.
  const GgufFile& file = model.file();
  cache_identity_ = fmt::format("model={}|size={}|tensors={}|data={}|k={}|v={}|rotate={}|kivi={}|block={}",
                                file.name(), file.file_size(), file.tensors().size(), file.data_offset(),
                                kv_type_name(storage_->k_type()), kv_type_name(storage_->v_type()),
                                storage_->keys_rotated(), storage_->kivi_residual_tokens(), options.block_size);
  metrics_.blocks_total = options.num_blocks;
  metrics_.blocks_free = options.num_blocks;
  metrics_.bytes_per_block = storage_->bytes_per_block();
  metrics_.local_slots_total = storage_->num_local_slots();
  metrics_.local_bytes_per_slot = storage_->local_bytes_per_block();
}

Engine::~Engine() { stop(); }

int Engine::blocks_for_request(const EvictionOptions& eviction, int64_t total_tokens) const {
  return EvictingSequence::max_blocks(eviction, options_.block_size, options_.max_batch_tokens, total_tokens);
}

Result<RequestId> Engine::submit(RequestOptions request, TokenCallback on_event) {
  const ModelConfig& config = model_.config();
  const Tokenizer& tokenizer = model_.tokenizer();
  auto reject = [&](Status status) -> Result<RequestId> {
    std::lock_guard<std::mutex> lock(mutex_);
    ++metrics_.requests_rejected;
    return status;
  };
  if (request.prompt.empty() && !request.prompt_text.empty()) {
    request.prompt = tokenizer.encode(request.prompt_text, tokenizer.add_bos(),
                                      request.parse_special ? SpecialTokens::kParse : SpecialTokens::kAsText);
  }
  if (request.prompt.empty()) return reject(Status::error("the prompt is empty (it needs at least one token)"));
  for (TokenId id : request.prompt) {
    if (id < 0 || id >= config.vocab_size) {
      return reject(Status::errorf("prompt token {} is outside the vocabulary of {}", id, config.vocab_size));
    }
  }
  if (Status s = validate_eviction_options(request.eviction); !s.ok()) return reject(s);
  if (Status s = request.sampler.validate(); !s.ok()) return reject(s);
  if (request.max_tokens < 0) return reject(Status::errorf("max_tokens {} must be >= 0", request.max_tokens));
  const int num_prompt = static_cast<int>(request.prompt.size());
  if (num_prompt > config.context_length && !window_policy(request.eviction.policy)) {
    return reject(Status::errorf("the prompt has {} tokens, more than the model's context of {} (a window or "
                                 "streaming policy can run past it)",
                                 num_prompt, config.context_length));
  }
  const int limit = request_token_limit(config, num_prompt, request.max_tokens, request.eviction.policy);
  const int needed = blocks_for_request(request.eviction, std::max(limit, num_prompt));
  if (needed > options_.num_blocks) {
    return reject(Status::errorf("the request needs up to {} KV blocks ({} prompt + {} new tokens) but the pool has "
                                 "only {}: lower max_tokens, use an eviction policy, or give the pool more memory",
                                 needed, num_prompt, std::max(0, limit - num_prompt), options_.num_blocks));
  }

  auto r = std::make_unique<EngineRequest>();
  r->options = std::move(request);
  r->on_event = std::move(on_event);
  r->tokens = r->options.prompt;
  r->num_prompt = num_prompt;
  r->limit = std::max(limit, num_prompt);
  r->root = prefix_root_hash(cache_identity_, r->options.cache_salt);
  r->sampler = std::make_unique<Sampler>(r->options.sampler);
  r->detokenizer = std::make_unique<IncrementalDetokenizer>(tokenizer);
  r->detokenizer->set_prompt(r->tokens);
  r->stop = std::make_unique<StopMatcher>(r->options.stop_strings);
  r->submitted_at = EngineRequest::Clock::now();
  r->stats.prompt_tokens = num_prompt;

  std::lock_guard<std::mutex> lock(mutex_);
  r->id = RequestId(next_request_id_++);
  const RequestId id = r->id;
  in_flight_.insert(id.value);
  ++metrics_.requests_submitted;
  metrics_.tokens_prompted += num_prompt;
  submitted_.push_back(std::move(r));
  work_.notify_all();
  return id;
}

bool Engine::cancel(RequestId id) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!in_flight_.contains(id.value)) return false;
  cancelled_.push_back(id);
  work_.notify_all();
  return true;
}

void Engine::take_submissions() {
  std::vector<std::unique_ptr<EngineRequest>> fresh;
  std::vector<RequestId> cancelled;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fresh.swap(submitted_);
    cancelled.swap(cancelled_);
  }
  for (auto& r : fresh) {
    // Higher priority waits ahead of lower; equal priorities keep arrival order.
    auto it = std::find_if(waiting_.begin(), waiting_.end(),
                           [&](const auto& w) { return w->options.priority < r->options.priority; });
    waiting_.insert(it, std::move(r));
  }
  for (RequestId id : cancelled) {
    for (auto& r : running_) {
      if (r->id == id && !r->done) finish(*r, FinishReason::kCancelled);
    }
    for (auto& r : waiting_) {
      if (r->id == id && !r->done) finish(*r, FinishReason::kCancelled);
    }
  }
}

void Engine::release(EngineRequest& r) {
  if (!r.sequence) return;
  r.stats.eviction = r.sequence->stats();
  r.stats.peak_blocks = std::max(r.stats.peak_blocks, r.sequence->stats().peak_blocks);
  r.stats.live_tokens = r.sequence->num_live();
  r.sequence.reset();  // its blocks go back; published ones stay findable (cached-free)
}

void Engine::emit_token(EngineRequest& r, TokenId token, std::string text) {
  TokenEvent event;
  event.id = r.id;
  event.token = token;
  event.text = std::move(text);
  if (!r.captured_logits.empty()) event.logits = &r.captured_logits;
  if (r.on_event) r.on_event(event);
  r.captured_logits.clear();
}

void Engine::finish(EngineRequest& r, FinishReason reason, std::string error) {
  if (r.done) return;
  r.done = true;
  release(r);
  const auto now = EngineRequest::Clock::now();
  r.stats.total_seconds = seconds_between(r.submitted_at, now);
  r.stats.completion_tokens = r.num_generated;
  if (r.stats.inter_token.size() > 0) {
    double sum = 0;
    for (double d : r.stats.inter_token) sum += d;
    r.stats.mean_inter_token = sum / static_cast<double>(r.stats.inter_token.size());
  }
  TokenEvent event;
  event.id = r.id;
  event.finish = reason;
  event.error = std::move(error);
  event.stats = &r.stats;
  if (!r.captured_logits.empty()) event.logits = &r.captured_logits;
  if (reason == FinishReason::kStop || reason == FinishReason::kLength) {
    event.text = r.stop->push(r.detokenizer->finish());
    event.text += r.stop->finish();
  }
  if (r.on_event) r.on_event(event);
  std::lock_guard<std::mutex> lock(mutex_);
  in_flight_.erase(r.id.value);
  switch (reason) {
    case FinishReason::kCancelled: ++metrics_.requests_cancelled; break;
    case FinishReason::kError: ++metrics_.requests_failed; break;
    default: ++metrics_.requests_finished; break;
  }
}

void Engine::preempt(EngineRequest& r) {
  release(r);
  r.num_computed = 0;
  r.num_published = 0;
  r.replaying = !r.step_sizes.empty();
  r.replay_next = 0;
  ++r.stats.preemptions;
  std::lock_guard<std::mutex> lock(mutex_);
  ++metrics_.preemptions;
}

int Engine::local_window_cached(std::span<const BlockId> hits) const {
  if (!storage_->has_local_layers()) return static_cast<int>(hits.size());
  // A new token at position P = k blocks sees positions > P - window on the local layers.
  const int64_t bs = options_.block_size;
  const int64_t window = model_.config().sliding_window.window;
  for (int k = static_cast<int>(hits.size()); k > 0; --k) {
    const int first = static_cast<int>(std::max<int64_t>(0, k * bs - window + 1) / bs);
    bool cached = true;
    for (int j = first; j < k && cached; ++j) cached = storage_->local_block_cached(hits[static_cast<size_t>(j)]);
    if (cached) return k;
  }
  return 0;
}

void Engine::admit(EngineRequest& r) {
  r.sequence = std::make_unique<EvictingSequence>(model_, cache_, *storage_, r.options.eviction);
  const EvictionPolicy policy = r.options.eviction.policy;
  const int bs = options_.block_size;
  // A cached block holds K/V computed with every earlier token visible: any request may use it
  // before its policy first evicts, i.e. within its budget. H2O and SnapKV also need the
  // attention each cached token received, which a block does not keep; a replaying request
  // must recompute its steps as they were.
  const bool may_hit = options_.prefix_caching && !r.replaying &&
                       (policy == EvictionPolicy::kNone || window_policy(policy));
  int hit_tokens = 0;
  if (may_hit) {
    int max_blocks = (static_cast<int>(r.tokens.size()) - 1) / bs;  // the last token is always computed
    if (window_policy(policy)) max_blocks = std::min(max_blocks, r.options.eviction.budget / bs);
    extend_block_hashes(r, max_blocks, bs);
    std::vector<BlockId> hits = cache_.match_prefix(
        std::span<const BlockHash>(r.block_hashes).first(static_cast<size_t>(max_blocks)), r.tokens);
    hits.resize(static_cast<size_t>(local_window_cached(hits)));
    if (!hits.empty()) r.sequence->attach_prefix(hits);
    hit_tokens = static_cast<int>(hits.size()) * bs;
    r.num_published = static_cast<int>(hits.size());
  }
  r.num_computed = hit_tokens;
  if (!r.admitted_before) r.stats.cached_prompt_tokens = hit_tokens;
}

void Engine::publish_full_blocks(EngineRequest& r) {
  if (!options_.prefix_caching || !r.sequence) return;
  const EvictionStats& ev = r.sequence->stats();
  // Once a policy evicted, slots no longer hold tokens [i·B, (i+1)·B) of the text.
  if (ev.tokens_evicted > 0 || ev.compactions > 0) return;
  const int bs = options_.block_size;
  const int num_full = r.sequence->num_slots() / bs;
  const std::vector<int32_t>& ids = cache_.table(r.sequence->seq()).block_ids();
  // Every layer seals a block at the same step; a local layer may have let it go already, so a
  // global layer (when there is one) is asked.
  int last_layer = model_.config().num_layers - 1;
  while (last_layer > 0 && storage_->is_local_layer(last_layer)) --last_layer;
  for (int b = r.num_published; b < num_full; ++b) {
    // KIVI blocks are final once sealed (out of the residual window); they seal in order.
    if (storage_->is_staged(last_layer, BlockId(ids[static_cast<size_t>(b)]))) break;
    extend_block_hashes(r, b + 1, bs);
    const std::span<const TokenId> block_tokens =
        std::span<const TokenId>(r.tokens).subspan(static_cast<size_t>(b) * bs, static_cast<size_t>(bs));
    if (cache_.publish_block(r.sequence->seq(), b, r.block_hashes[static_cast<size_t>(b)], block_tokens)) {
      std::lock_guard<std::mutex> lock(mutex_);
      ++metrics_.blocks_published;
    }
    r.num_published = b + 1;
  }
}

bool Engine::after_forward(EngineRequest& r, int taken, const float* logits, int num_rows) {
  const size_t vocab = static_cast<size_t>(model_.config().vocab_size);
  r.sequence->commit_step();
  const int first_new = r.num_computed;
  r.num_computed += taken;
  if (r.replaying) {
    if (++r.replay_next == r.step_sizes.size()) r.replaying = false;
  } else if (r.options.eviction.policy != EvictionPolicy::kNone) {
    r.step_sizes.push_back(taken);
  }
  if (r.options.logits == LogitsCapture::kAll) {
    // Rows of tokens computed for the first time (a recompute after preemption adds none).
    for (int i = 0; i < num_rows; ++i) {
      const int token_idx = first_new + (taken - num_rows) + i;
      if (token_idx >= r.high_water) {
        r.captured_logits.insert(r.captured_logits.end(), logits + i * vocab, logits + (i + 1) * vocab);
      }
    }
  }
  r.high_water = std::max(r.high_water, r.num_computed);
  publish_full_blocks(r);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    metrics_.tokens_computed += taken;
  }
  // Caught up when the prompt is computed: the last row predicts the next token.
  return r.num_computed >= static_cast<int>(r.tokens.size());
}

void Engine::sample_and_take(std::vector<SampleJob>& jobs) {
  for (SampleJob& job : jobs) {
    EngineRequest& r = *job.request;
    if (r.options.logits == LogitsCapture::kSampled) r.captured_logits.assign(job.logits.begin(), job.logits.end());
  }
  // A draw without a cut walks the whole vocabulary (~0.7 ms at 128k): 16 sequences' draws one
  // after another were ~10% of a batched decode step while the other threads waited.
  auto draw = [&jobs](int64_t i) {
    SampleJob& job = jobs[static_cast<size_t>(i)];
    try {
      job.token = job.request->sampler->sample(job.logits, job.request->tokens);
    } catch (const std::bad_alloc&) {
      job.token = -1;
    }
  };
  if (jobs.size() == 1) {
    draw(0);
  } else if (jobs.size() > 1) {
    pool_.run(static_cast<int64_t>(jobs.size()), draw);
  }
  for (SampleJob& job : jobs) {
    if (job.token < 0) {
      finish(*job.request, FinishReason::kError, "out of memory while sampling the next token; the request was ended");
    } else {
      take_token(*job.request, job.token);
    }
  }
}

void Engine::take_token(EngineRequest& r, TokenId next) {
  const auto now = EngineRequest::Clock::now();
  if (r.num_generated == 0) {
    r.stats.time_to_first_token = seconds_between(r.submitted_at, now);
  } else {
    r.stats.inter_token.push_back(seconds_between(r.last_token_at, now));
  }
  r.last_token_at = now;
  const Tokenizer& tok = model_.tokenizer();
  const bool eos = next == tok.eos_id() || next == tok.bos_id();
  const bool stop_token = std::find(r.options.stop_tokens.begin(), r.options.stop_tokens.end(), next) !=
                          r.options.stop_tokens.end();
  if ((r.options.stop_at_eos && eos) || stop_token) {
    finish(r, FinishReason::kStop);
    return;
  }
  r.tokens.push_back(next);
  ++r.num_generated;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++metrics_.tokens_generated;
  }
  emit_token(r, next, r.stop->push(r.detokenizer->push(next)));
  if (r.stop->stopped()) {
    finish(r, FinishReason::kStop);
  } else if (static_cast<int>(r.tokens.size()) >= r.limit) {
    finish(r, FinishReason::kLength);
  }
}

void Engine::schedule_and_run() {
  take_submissions();
  std::erase_if(running_, [](const auto& r) { return r->done; });
  std::erase_if(waiting_, [](const auto& r) { return r->done; });
  std::stable_sort(running_.begin(), running_.end(), runs_before);

  int budget = options_.max_batch_tokens;
  std::vector<EngineRequest*> planned;
  auto plan = [&](EngineRequest& r) -> int {  // tokens planned, 0 = no room, -1 = failed
    int want = static_cast<int>(r.tokens.size()) - r.num_computed;
    if (r.replaying) want = r.step_sizes[r.replay_next];
    const int give = std::min(want, budget);
    if (give <= 0 || (r.replaying && give < want)) return 0;
    const std::span<const TokenId> next = std::span<const TokenId>(r.tokens).subspan(static_cast<size_t>(r.num_computed),
                                                                                     static_cast<size_t>(give));
    const LogitsRows rows = r.options.logits == LogitsCapture::kAll ? LogitsRows::kAll : LogitsRows::kLast;
    Result<int> taken = r.sequence->plan_step(next, rows, r.step);
    if (!taken.ok()) {
      finish(r, FinishReason::kError, taken.status().message());
      return -1;
    }
    return *taken;
  };

  // Running requests first: decode tokens, then unfinished prompt chunks, so a long prompt
  // never stalls the decodes. A request that cannot get its blocks preempts the lowest-priority,
  // most recently admitted running request not planned this step — or waits itself, preempted,
  // when that one ranks above it.
  std::vector<EngineRequest*> preempted;  // in preemption order
  auto preempt_for = [&](EngineRequest& r) -> bool {  // false: r itself was preempted
    EngineRequest* victim = nullptr;
    for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
      EngineRequest* v = it->get();
      if (v != &r && !v->done && v->planned == 0 && v->sequence) {
        victim = v;
        break;
      }
    }
    const bool victim_ranks_lower =
        victim != nullptr && (victim->options.priority != r.options.priority
                                  ? victim->options.priority < r.options.priority
                                  : victim->admission > r.admission);
    EngineRequest& out = victim_ranks_lower ? *victim : r;
    preempt(out);
    preempted.push_back(&out);
    return &out != &r;
  };
  auto plan_running = [&](EngineRequest& r) {
    while (budget > 0 && !r.done && r.sequence) {
      const int taken = plan(r);
      if (taken > 0) {
        r.planned = taken;
        budget -= taken;
        planned.push_back(&r);
        return;
      }
      if (taken < 0) return;
      if (r.replaying && r.step_sizes[r.replay_next] > budget) return;  // its step waits for a fuller budget
      if (!preempt_for(r)) return;
    }
  };
  auto is_decode = [](const EngineRequest& r) {
    return !r.replaying && r.num_computed >= r.num_prompt &&
           static_cast<int>(r.tokens.size()) - r.num_computed == 1;
  };
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < running_.size(); ++i) {
      EngineRequest& r = *running_[i];
      if (r.planned == 0 && is_decode(r) == (pass == 0)) plan_running(r);
    }
  }
  // The preempted go back to the front of the queue; the last preempted (the highest ranked of
  // them) ends up first.
  for (EngineRequest* p : preempted) {
    auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& q) { return q.get() == p; });
    KVLM_CHECK(it != running_.end(), "preempted request {} is not running", p->id.value);
    waiting_.push_front(std::move(*it));
    running_.erase(it);
  }

  // Then waiting ones, in order, while their next chunk fits (a head that does not fit waits:
  // later, smaller requests do not overtake it).
  while (budget > 0 && !waiting_.empty() && static_cast<int>(running_.size()) < options_.max_seqs) {
    EngineRequest& r = *waiting_.front();
    if (r.done) {
      waiting_.pop_front();
      continue;
    }
    admit(r);
    // The last token is never taken from the cache: there is always something to compute.
    KVLM_CHECK(r.num_computed < static_cast<int>(r.tokens.size()), "request {} admitted with nothing to compute",
               r.id.value);
    const int taken = plan(r);
    if (taken < 0) {
      waiting_.pop_front();
      continue;
    }
    if (taken == 0) {
      release(r);  // its hit blocks go back (still cached); it waits for room
      r.num_computed = 0;
      r.num_published = 0;
      break;
    }
    r.planned = taken;
    budget -= taken;
    if (options_.prefix_caching) {
      // Lookups count when the request starts, not for each try of a head that did not fit;
      // num_computed is still the hit here (the forward has not run).
      std::lock_guard<std::mutex> lock(mutex_);
      metrics_.prefix_queries_tokens += static_cast<int64_t>(r.tokens.size());
      metrics_.prefix_hit_tokens += r.num_computed;
    }
    r.admission = next_admission_++;
    r.admitted_before = true;
    planned.push_back(&r);
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }

  if (!planned.empty() && run_forward(planned)) {
    {
      const uint64_t staging = storage_->staging_bytes();
      std::lock_guard<std::mutex> lock(mutex_);
      metrics_.peak_staging_bytes = std::max<uint64_t>(metrics_.peak_staging_bytes, staging);
    }
    const size_t vocab = static_cast<size_t>(model_.config().vocab_size);
    size_t row = 0;
    std::vector<SampleJob> jobs;
    for (EngineRequest* r : planned) {
      const int rows = r->step.logits_rows == LogitsRows::kAll ? r->planned : 1;
      const float* logits = logits_.data() + row * vocab;
      if (after_forward(*r, r->planned, logits, rows)) {
        jobs.push_back({.request = r, .logits = {logits + static_cast<size_t>(rows - 1) * vocab, vocab}});
      }
      row += static_cast<size_t>(rows);
      r->planned = 0;
    }
    sample_and_take(jobs);
    std::lock_guard<std::mutex> lock(mutex_);
    ++metrics_.steps;
  }
  std::erase_if(running_, [](const auto& r) { return r->done; });
  std::erase_if(waiting_, [](const auto& r) { return r->done; });
  note_usage();
}

bool Engine::run_forward(const std::vector<EngineRequest*>& planned) {
  try {
    std::vector<SequenceStep> steps;
    steps.reserve(planned.size());
    for (EngineRequest* r : planned) steps.push_back(r->step);
    if (options_.faults && options_.faults->should_fail(FaultInjection::Site::kStepForward)) throw std::bad_alloc();
    model_.forward_batch(steps, *storage_, pool_, logits_);
    return true;
  } catch (const std::bad_alloc&) {
    // Scratch buffers grow with the step's tokens; the K/V of this step is half written and
    // uncommitted. Retrying the same batch would likely fail again, so its requests end with a
    // clear error and give their blocks back (published blocks hold only earlier, whole steps).
    for (EngineRequest* r : planned) {
      r->planned = 0;
      finish(*r, FinishReason::kError,
             fmt::format("out of memory in the forward pass of a step of {} request(s); the request was ended",
                         planned.size()));
    }
    return false;
  }
}

void Engine::note_usage() {
  const int used = cache_.num_used_blocks();
  const int cached_free = cache_.num_cached_free_blocks();
  std::lock_guard<std::mutex> lock(mutex_);
  metrics_.requests_running = static_cast<int>(running_.size());
  metrics_.requests_waiting = static_cast<int>(waiting_.size() + submitted_.size());
  metrics_.blocks_used = used;
  metrics_.blocks_cached_free = cached_free;
  metrics_.blocks_free = cache_.num_free_blocks() - cached_free;
  metrics_.peak_blocks_used = std::max(metrics_.peak_blocks_used, used);
  metrics_.staging_bytes = storage_->staging_bytes();
  metrics_.local_slots_pinned = storage_->local_blocks_in_use();
  metrics_.local_slots_retained = storage_->local_blocks_retained();
  metrics_.blocks_evicted = cache_.prefix_stats().blocks_evicted;
}

bool Engine::step() {
  // The scheduler's state belongs to one stepping thread; a second one is a caller's bug.
  KVLM_CHECK(!stepping_.exchange(true), "Engine::step() called while another step runs (after start(), only the "
                                        "engine's thread steps)");
  bool worked = false;
  {
    std::lock_guard<std::mutex> step_lock(step_mutex_);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      worked = !(submitted_.empty() && cancelled_.empty() && running_.empty() && waiting_.empty());
    }
    if (worked) schedule_and_run();
  }
  stepping_ = false;
  return worked;
}

void Engine::run_until_idle() {
  while (step()) {
  }
}

void Engine::start() {
  if (thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = false;
  }
  thread_ = std::thread([this] {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        work_.wait(lock, [&] { return stopping_ || !in_flight_.empty() || !cancelled_.empty(); });
        if (stopping_) return;
      }
      step();
    }
  });
}

void Engine::stop() {
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    work_.notify_all();
    thread_.join();
  }
  std::lock_guard<std::mutex> step_lock(step_mutex_);
  take_submissions();
  for (auto& r : running_) finish(*r, FinishReason::kCancelled);
  for (auto& r : waiting_) finish(*r, FinishReason::kCancelled);
  running_.clear();
  waiting_.clear();
  note_usage();
}

EngineMetrics Engine::metrics() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return metrics_;
}

int Engine::leaked_blocks() const {
  std::lock_guard<std::mutex> step_lock(step_mutex_);
  std::unordered_set<int32_t> held;
  for (const auto& r : running_) {
    if (!r->sequence) continue;
    for (int32_t id : cache_.table(r->sequence->seq()).block_ids()) held.insert(id);
  }
  return cache_.num_used_blocks() - static_cast<int>(held.size());
}

}  // namespace kvlm
