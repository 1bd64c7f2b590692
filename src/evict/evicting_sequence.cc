#include "evict/evicting_sequence.h"

#include <algorithm>

#include "core/check.h"
#include "evict/eviction_selection.h"

namespace kvlm {
namespace {

int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

}  // namespace

void EvictionStats::add(const EvictionStats& o) {
  tokens_evicted += o.tokens_evicted;
  blocks_dropped += o.blocks_dropped;
  compactions += o.compactions;
  tokens_moved += o.tokens_moved;
  blocks_copied += o.blocks_copied;
  weight_passes += o.weight_passes;
  peak_blocks = std::max(peak_blocks, o.peak_blocks);
  peak_live_tokens = std::max(peak_live_tokens, o.peak_live_tokens);
}

EvictingSequence::EvictingSequence(LlamaModel& model, KvCacheManager& cache, KvStorage& storage,
                                   const EvictionOptions& options)
    : EvictingSequence(model, cache, storage, options, cache.create_sequence()) {}

EvictingSequence::EvictingSequence(LlamaModel& model, KvCacheManager& cache, KvStorage& storage,
                                   const EvictionOptions& options, SeqId seq)
    : model_(model), cache_(cache), storage_(storage), options_(options), seq_(seq) {
  const Status valid = validate_eviction_options(options);
  KVLM_CHECK(valid.ok(), "EvictingSequence: {}", valid.message());
  KVLM_CHECK(cache.block_size() == storage.layout().block_size, "cache block size {} != storage block size {}",
             cache.block_size(), storage.layout().block_size);
}

EvictingSequence::~EvictingSequence() {
  local_hold_.release_all(storage_, cache_.table(seq_).block_ids());
  // Staging goes back only for blocks no other sequence still holds.
  std::vector<int32_t> last_owner;
  for (int32_t id : cache_.table(seq_).block_ids()) {
    if (cache_.pool().ref_count(BlockId{id}) == 1) last_owner.push_back(id);
  }
  storage_.release_blocks(last_owner);
  cache_.free_sequence(seq_);
}

Result<std::unique_ptr<EvictingSequence>> EvictingSequence::fork() const {
  const SeqId copy = cache_.fork_sequence(seq_);
  std::unique_ptr<EvictingSequence> forked(new EvictingSequence(model_, cache_, storage_, options_, copy));
  forked->num_fed_ = num_fed_;
  forked->num_sinks_ = num_sinks_;
  forked->window_begin_ = window_begin_;
  forked->slot_positions_ = slot_positions_;
  forked->slot_scores_ = slot_scores_;
  forked->local_hold_.adopt(storage_, cache_.table(copy).block_ids(), local_hold_.begin());
  forked->note_peaks();
  return forked;
}

bool EvictingSequence::keeps_window() const {
  return options_.policy == EvictionPolicy::kNone || options_.policy == EvictionPolicy::kWindow ||
         options_.policy == EvictionPolicy::kStreaming;
}

int EvictingSequence::num_slots() const { return cache_.table(seq_).num_tokens(); }
int EvictingSequence::num_blocks() const { return cache_.table(seq_).num_blocks(); }

int EvictingSequence::num_live() const {
  return keeps_window() ? num_sinks_ + (num_slots() - window_begin_) : num_slots();
}

std::vector<int64_t> EvictingSequence::live_positions() const {
  if (!keeps_window()) return slot_positions_;
  std::vector<int64_t> positions;
  for (int s = 0; s < num_sinks_; ++s) positions.push_back(s);
  const int window = num_slots() - window_begin_;
  for (int i = 0; i < window; ++i) positions.push_back(num_fed_ - window + i);
  return positions;
}

int EvictingSequence::max_blocks(const EvictionOptions& options, int block_size, int max_step_tokens,
                                 int64_t max_tokens) {
  const int64_t bs = block_size;
  const int all_tokens = ceil_div(max_tokens, bs);
  int bound = all_tokens;
  switch (options.policy) {
    case EvictionPolicy::kNone:
      return all_tokens;
    case EvictionPolicy::kWindow:
    case EvictionPolicy::kStreaming:
      // Live tokens, plus evicted slots in the sinks' last block and the window's first one.
      bound = ceil_div(options.budget + 2 * (bs - 1), bs) + 1;
      break;
    case EvictionPolicy::kH2o:
      bound = ceil_div(options.budget, bs) + 1;
      break;
    case EvictionPolicy::kSnapKv:
      // A prompt step runs whole on top of the compressed cache before it is compressed.
      bound = ceil_div(options.budget + std::max(max_step_tokens, options.budget), bs) + 1;
      break;
  }
  // A sequence never holds more slots than it was fed: short inputs need no more than that.
  return std::min(bound, all_tokens + 2);
}

int EvictingSequence::evicted_slot_blocks(const EvictionOptions& options) {
  return options.policy == EvictionPolicy::kWindow || options.policy == EvictionPolicy::kStreaming ? 2 : 0;
}

int EvictingSequence::next_step_size(int remaining) const {
  if (options_.policy == EvictionPolicy::kNone) return remaining;
  if (options_.policy == EvictionPolicy::kSnapKv && remaining >= options_.snapkv_window) return remaining;
  const int room = options_.budget - num_live();
  if (remaining <= room) return remaining;
  if (room > 0) return room;  // fill up to the budget first
  return std::min(remaining, options_.evicting_step);
}

bool EvictingSequence::make_room(int step) {
  if (!deferred_kept_.empty()) {
    if (!compact_to(deferred_kept_)) return false;
    deferred_kept_.clear();
  }
  const int excess = num_live() + step - options_.budget;
  if (options_.policy == EvictionPolicy::kNone || excess <= 0) return true;
  switch (options_.policy) {
    case EvictionPolicy::kWindow:
    case EvictionPolicy::kStreaming:
      evict_oldest_window_tokens(excess);
      break;
    case EvictionPolicy::kH2o: {
      const std::vector<int> victims = h2o_victims(slot_scores_, options_.h2o_recent(), excess);
      KVLM_CHECK(static_cast<int>(victims.size()) == excess, "h2o found {} victims for {}", victims.size(), excess);
      std::vector<int> kept;
      kept.reserve(static_cast<size_t>(num_slots() - excess));
      size_t v = 0;
      for (int s = 0; s < num_slots(); ++s) {
        if (v < victims.size() && victims[v] == s) {
          ++v;
        } else {
          kept.push_back(s);
        }
      }
      return compact_to(kept);
    }
    case EvictionPolicy::kSnapKv: {
      if (step >= options_.snapkv_window) return true;  // a prompt step: compressed after it runs
      std::vector<int> kept;  // decode past the budget: the oldest tokens go, as in a window
      for (int s = excess; s < num_slots(); ++s) kept.push_back(s);
      return compact_to(kept);
    }
    case EvictionPolicy::kNone:
      break;
  }
  return true;
}

void EvictingSequence::evict_oldest_window_tokens(int count) {
  if (options_.policy == EvictionPolicy::kStreaming && num_sinks_ == 0 && window_begin_ == 0) {
    // The first eviction: from now on the first `sinks` tokens are the sinks.
    num_sinks_ = std::min(options_.sinks, num_slots());
    window_begin_ = num_sinks_;
  }
  window_begin_ += count;
  KVLM_CHECK(window_begin_ <= num_slots(), "evicting {} tokens leaves a window starting at {} of {} slots", count,
             window_begin_, num_slots());
  stats_.tokens_evicted += count;
  // Blocks wholly inside the evicted range [num_sinks_, window_begin_) go back untouched.
  const int bs = cache_.block_size();
  const int first = ceil_div(num_sinks_, bs);
  const int end = window_begin_ / bs;
  if (end > first) {
    local_hold_.drop(storage_, cache_.table(seq_).block_ids(), first, end - first);
    release_staging(cache_.drop_blocks(seq_, first, end - first));
    window_begin_ -= (end - first) * bs;
    stats_.blocks_dropped += end - first;
  }
}

void EvictingSequence::release_staging(const std::vector<BlockId>& freed) {
  std::vector<int32_t> ids;
  for (BlockId b : freed) ids.push_back(b.value);
  storage_.release_blocks(ids);
}

Status EvictingSequence::make_exclusive(int first_block_idx, int end_block_idx) {
  const int end = std::min(end_block_idx, cache_.table(seq_).num_blocks());
  for (int b = std::max(0, first_block_idx); b < end; ++b) {
    // The copy of a block the window covers needs a local slot: make sure one can be had first.
    if (local_hold_.covers(b) && cache_.block_ref_count(seq_, b) > 1 && storage_.local_slots_unpinned() == 0) {
      return Status::errorf("the sliding-window layers have no local slot left for a copy of block {}", b);
    }
    KVLM_ASSIGN_OR_RETURN(std::optional<BlockSwap> swap, cache_.make_block_exclusive(seq_, b));
    if (swap) {
      KVLM_CHECK(local_hold_.pin_copy(storage_, b, swap->copy), "a local slot was free for the copy");
      storage_.copy_block(swap->shared, swap->copy);
      local_hold_.unpin_swapped(storage_, b, swap->shared);
      ++stats_.blocks_copied;
    }
  }
  return Status::ok_status();
}

bool EvictingSequence::compact_to(const std::vector<int>& kept) {
  const int n = num_slots();
  if (static_cast<int>(kept.size()) == n) return true;
  int first_moved = 0;
  while (first_moved < static_cast<int>(kept.size()) && kept[static_cast<size_t>(first_moved)] == first_moved) {
    ++first_moved;
  }
  // Compaction writes only blocks from the first moved token on; shared ones are copied first.
  // Copies made before a failure stay: they hold the same bytes, so nothing is lost.
  if (!make_exclusive(first_moved / cache_.block_size(), cache_.blocks_for_tokens(static_cast<int>(kept.size())))
           .ok()) {
    return false;
  }
  // Local layers: only the survivors the next window reaches move, into blocks pinned first.
  int local_first_kept = -1;
  if (storage_.has_local_layers()) {
    const int64_t threshold = num_fed_ - model_.config().sliding_window.window;
    local_first_kept = static_cast<int>(kept.size());
    while (local_first_kept > 0 &&
           slot_positions_[static_cast<size_t>(kept[static_cast<size_t>(local_first_kept) - 1])] > threshold) {
      --local_first_kept;
    }
    if (!local_hold_.widen(storage_, cache_.table(seq_).block_ids(), local_first_kept / cache_.block_size())) {
      return false;
    }
  }
  storage_.compact(cache_.table(seq_).block_ids(), kept, local_first_kept);
  local_hold_.truncate(storage_, cache_.table(seq_).block_ids(), cache_.blocks_for_tokens(static_cast<int>(kept.size())));
  release_staging(cache_.truncate(seq_, static_cast<int>(kept.size())));

  std::vector<int64_t> positions;
  std::vector<float> scores;
  for (int s : kept) {
    positions.push_back(slot_positions_[static_cast<size_t>(s)]);
    if (!slot_scores_.empty()) scores.push_back(slot_scores_[static_cast<size_t>(s)]);
  }
  stats_.tokens_moved += static_cast<int64_t>(kept.size()) - first_moved;  // all later survivors shift
  slot_positions_ = std::move(positions);
  slot_scores_ = std::move(scores);
  stats_.tokens_evicted += n - static_cast<int>(kept.size());
  ++stats_.compactions;
  release_local_before_window();
  return true;
}

int EvictingSequence::first_slot_after(int64_t position) const {
  const int slots = num_slots();
  if (keeps_window()) {
    if (position + 1 < num_sinks_) return static_cast<int>(std::max<int64_t>(0, position + 1));  // a sink
    // The window's tokens hold consecutive positions, up to num_fed_ - 1.
    const int64_t window_first = num_fed_ - (slots - window_begin_);
    return static_cast<int>(window_begin_ + std::max<int64_t>(0, position + 1 - window_first));
  }
  const auto it = std::upper_bound(slot_positions_.begin(), slot_positions_.end(), position);
  if (it != slot_positions_.end()) return static_cast<int>(it - slot_positions_.begin());
  return static_cast<int>(slots + std::max<int64_t>(0, position + 1 - num_fed_));
}

void EvictingSequence::release_local_before_window() {
  if (!storage_.has_local_layers()) return;
  local_hold_.release_before(storage_, cache_.table(seq_).block_ids(),
                             first_slot_after(num_fed_ - model_.config().sliding_window.window));
}

void EvictingSequence::note_peaks() {
  stats_.peak_blocks = std::max(stats_.peak_blocks, num_blocks());
  stats_.peak_live_tokens = std::max(stats_.peak_live_tokens, num_live());
}

Result<int> EvictingSequence::plan_step(std::span<const TokenId> tokens, LogitsRows rows, SequenceStep& step) {
  KVLM_CHECK(pending_tokens_ == 0, "sequence {}: a step of {} tokens is still pending", seq_.value, pending_tokens_);
  const int vocab = model_.config().vocab_size;
  if (tokens.empty()) return Status::error("forward needs at least one token");
  const int n = next_step_size(static_cast<int>(tokens.size()));
  for (int i = 0; i < n; ++i) {
    const TokenId id = tokens[static_cast<size_t>(i)];
    if (id < 0 || id >= vocab) return Status::errorf("token {} is outside the vocabulary of {}", id, vocab);
  }
  if (!make_room(n)) return 0;
  const int slots = num_slots();
  const int live = num_live();
  const int bs = cache_.block_size();
  // The new tokens go into the partly filled last block (when there is one) and fresh blocks;
  // a shared or published last block is made this sequence's own first.
  if (slots % bs != 0 && !make_exclusive(slots / bs, slots / bs + 1).ok()) return 0;
  if (!cache_.reserve(seq_, n)) return 0;
  if (!local_hold_.extend(storage_, cache_.table(seq_).block_ids())) {
    release_staging(cache_.truncate(seq_, slots));  // the reserved blocks go back
    return 0;
  }

  pending_h2o_ = options_.policy == EvictionPolicy::kH2o;
  pending_snapkv_ =
      options_.policy == EvictionPolicy::kSnapKv && n >= options_.snapkv_window && live + n > options_.budget;
  step = SequenceStep{};
  step.tokens = tokens.first(static_cast<size_t>(n));
  step.num_cached_tokens = slots;
  step.block_table = cache_.table(seq_).block_ids();
  step.logits_rows = rows;
  step.first_position = num_fed_;
  step.num_sink_tokens = num_sinks_;
  step.window_begin = window_begin_;
  // Once tokens were evicted, a query's position within the cache trails its text position:
  // the sinks are scored with the queries rotated there (StreamingLLM's positions).
  step.first_sink_query_position = num_sinks_ > 0 && live != num_fed_ ? live : -1;
  if (pending_h2o_ || pending_snapkv_) {
    step_weights_.assign(static_cast<size_t>(slots + n), 0.0f);
    step.slot_weights = step_weights_.data();
    step.num_weight_queries = pending_h2o_ ? n : options_.snapkv_window;
    ++stats_.weight_passes;
  }
  if (has_sliding_window()) {
    const int window = model_.config().sliding_window.window;
    local_first_tokens_.resize(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) local_first_tokens_[static_cast<size_t>(i)] = first_slot_after(num_fed_ + i - window);
    step.local_first_tokens = local_first_tokens_;
  }
  pending_tokens_ = n;
  return n;
}

void EvictingSequence::attach_prefix(std::span<const BlockId> blocks) {
  KVLM_CHECK(num_fed_ == 0 && pending_tokens_ == 0, "sequence {}: a prefix attaches to an empty sequence only",
             seq_.value);
  KVLM_CHECK(keeps_window(), "sequence {}: policy {} keeps per-token scores a cached block lacks", seq_.value,
             eviction_policy_name(options_.policy));
  cache_.attach_prefix(seq_, blocks);
  num_fed_ = static_cast<int64_t>(blocks.size()) * cache_.block_size();
  // The blocks the next token's window reaches must still hold their local-layer bytes (the
  // engine matches only such prefixes).
  if (storage_.has_local_layers()) {
    const int first = first_slot_after(num_fed_ - model_.config().sliding_window.window);
    local_hold_.adopt(storage_, cache_.table(seq_).block_ids(), first / cache_.block_size());
  }
  KVLM_CHECK(options_.policy == EvictionPolicy::kNone || num_fed_ <= options_.budget,
             "sequence {}: a prefix of {} tokens exceeds the budget {}", seq_.value, num_fed_, options_.budget);
  note_peaks();
}

void EvictingSequence::commit_step() {
  const int n = pending_tokens_;
  KVLM_CHECK(n > 0, "sequence {}: commit_step without a planned step", seq_.value);
  pending_tokens_ = 0;
  const int slots = num_slots();
  cache_.append(seq_, n);
  num_fed_ += n;

  if (!keeps_window()) {
    for (int i = 0; i < n; ++i) slot_positions_.push_back(num_fed_ - n + i);
  }
  if (pending_h2o_) {
    slot_scores_.resize(static_cast<size_t>(slots + n), 0.0f);
    for (size_t s = 0; s < slot_scores_.size(); ++s) slot_scores_[s] += step_weights_[s];
  }
  note_peaks();
  if (pending_snapkv_) {
    std::vector<int> kept = snapkv_kept(step_weights_, options_.snapkv_window, options_.snapkv_kernel, options_.budget);
    if (!compact_to(kept)) deferred_kept_ = std::move(kept);
  }
  release_local_before_window();
}

Status EvictingSequence::forward(std::span<const TokenId> tokens, LogitsRows rows, ThreadPool& pool,
                                 std::vector<float>& logits) {
  const int vocab = model_.config().vocab_size;
  for (TokenId id : tokens) {
    if (id < 0 || id >= vocab) return Status::errorf("token {} is outside the vocabulary of {}", id, vocab);
  }
  if (tokens.empty()) return Status::error("forward needs at least one token");
  logits.clear();
  std::vector<float> step_logits;
  size_t pos = 0;
  while (pos < tokens.size()) {
    SequenceStep step;
    KVLM_ASSIGN_OR_RETURN(const int taken, plan_step(tokens.subspan(pos), rows, step));
    if (taken == 0) {
      const int wanted = next_step_size(static_cast<int>(tokens.size() - pos));
      return Status::errorf("the KV pool has no room for {} more tokens ({} blocks of {} free)", wanted,
                            cache_.num_free_blocks(), cache_.block_size());
    }
    model_.forward(step, storage_, pool, step_logits);
    commit_step();
    const bool last = pos + static_cast<size_t>(taken) == tokens.size();
    if (rows == LogitsRows::kAll || last) logits.insert(logits.end(), step_logits.begin(), step_logits.end());
    pos += static_cast<size_t>(taken);
  }
  return Status::ok_status();
}

}  // namespace kvlm
