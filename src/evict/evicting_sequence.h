// EvictingSequence: one sequence run through the model under an eviction policy and a token budget.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cache/kv_cache_manager.h"
#include "core/ids.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "evict/eviction_options.h"
#include "kv/kv_storage.h"
#include "kv/local_window_hold.h"
#include "model/llama_model.h"

namespace kvlm {

struct EvictionStats {
  int64_t tokens_evicted = 0;  // tokens attention no longer sees
  int64_t blocks_dropped = 0;  // whole blocks given back without moving a byte (window, streaming)
  int64_t compactions = 0;     // H2O and SnapKV: survivors moved down over their holes
  int64_t tokens_moved = 0;    // token slots those compactions copied
  int64_t blocks_copied = 0;   // shared blocks copied before being written (copy on write)
  int64_t weight_passes = 0;   // forwards that also summed attention weights (H2O, SnapKV)
  int peak_blocks = 0;         // most blocks the sequence held at once
  int peak_live_tokens = 0;    // most tokens attention saw at once (<= budget, except SnapKV prompts)

  // Totals over several sequences: counts add up, peaks take the larger.
  void add(const EvictionStats& other);
};

// Owns one sequence of a KvCacheManager and feeds it tokens, evicting as its policy says.
//
// Slots and positions. Tokens live in slots of the block table. The window and StreamingLLM
// never move a byte: the evicted slots between the sinks [0, sinks) and the window
// [window_begin, num_slots) are skipped by attention, and each block they fill entirely is
// dropped from the table (the slots after it renumber; nothing is copied), so memory stays
// within the budget plus two blocks. H2O and SnapKV evict scattered tokens: the survivors are
// compacted over the holes (KvStorage::compact) and the freed tail blocks go back to the pool.
// Keys are rotated once, with their position in the text, and never again: queries are rotated
// at their text position too, so the distance to every window token is the true one. For
// StreamingLLM's sinks a second copy of each query is rotated at its position within the cache
// (sinks + window tokens before it), which makes its distance to sink s what the paper
// prescribes; the window tokens' mutual distances never change, so they need nothing.
//
// Sharing: a block is only written (new tokens, compaction) once this sequence is its sole
// owner; a shared block is copied first (KvCacheManager::make_block_exclusive + copy_block).
// Dropping a shared block just releases this sequence's reference.
//
// Sliding-window layers (gemma3's local layers) see, from a query at text position p, the
// tokens at positions > p - window: by position, not slot, so under eviction the sequence
// tells the model the first slot each query sees there (SequenceStep::local_first_tokens; the
// live positions are increasing in slot order, so that first slot is all it takes). On a
// storage that keeps only the windows, it pins the blocks its window covers (LocalWindowHold)
// and no others: compaction moves only the tokens later windows reach.
class EvictingSequence {
 public:
  // Creates the sequence in `cache`; `storage` holds its bytes. Options must be valid
  // (validate_eviction_options).
  EvictingSequence(LlamaModel& model, KvCacheManager& cache, KvStorage& storage, const EvictionOptions& options);
  // Gives the sequence's blocks (and KIVI staging) back.
  ~EvictingSequence();
  EvictingSequence(const EvictingSequence&) = delete;
  EvictingSequence& operator=(const EvictingSequence&) = delete;

  // A second sequence sharing every block of this one, with the same history: both continue
  // independently, copying shared blocks before they write them. Errors when the pool is full.
  Result<std::unique_ptr<EvictingSequence>> fork() const;

  // Feeds `tokens` after every token fed so far and returns their logits (kAll: one row per
  // token; kLast: the last one's). Long inputs run in several forwards: as much as fits before
  // the budget is reached, then options.evicting_step tokens at a time, evicting before each.
  // SnapKV runs each step of at least snapkv_window tokens whole (it is a prompt) and then
  // compresses; shorter steps past the budget evict the oldest token.
  // Errors: the pool has no room (naming the blocks needed), tokens outside the vocabulary.
  Status forward(std::span<const TokenId> tokens, LogitsRows rows, ThreadPool& pool, std::vector<float>& logits);

  // The same work split around a batched forward (the engine runs many sequences in one
  // LlamaModel::forward_batch). plan_step takes the first tokens of `tokens` that the policy
  // lets run in one forward (all of them without a policy), evicts to make room for them,
  // copies the shared blocks they write, reserves their blocks and describes the forward in
  // `step` (its spans point into this sequence's table and buffers: valid until commit_step).
  // Returns how many tokens it took, or 0 when the pool has no room for them (nothing
  // reserved; the caller frees blocks, e.g. by preempting another sequence, and plans again).
  // Errors: tokens outside the vocabulary, an empty span. After the forward, commit_step
  // records the tokens as cached and does the policy's after-step work (H2O scores,
  // SnapKV's compression). One planned step at a time.
  Result<int> plan_step(std::span<const TokenId> tokens, LogitsRows rows, SequenceStep& step);
  void commit_step();
  // Starts an empty sequence with cached blocks (a prefix-cache hit): their tokens count as fed
  // and computed with every earlier token visible, so only policies that have not evicted yet
  // and keep no per-token scores may take them (none, window, streaming; a CHECK).
  void attach_prefix(std::span<const BlockId> blocks);

  int64_t num_fed() const { return num_fed_; }  // tokens fed; the next one's text position
  int num_live() const;                          // tokens attention sees now
  int num_slots() const;                         // slots in the table (live + evicted, not yet dropped)
  int num_blocks() const;                        // blocks the table holds
  // Text position of every live token, in slot order (sinks, then the window or the survivors).
  std::vector<int64_t> live_positions() const;
  const EvictionStats& stats() const { return stats_; }
  const EvictionOptions& options() const { return options_; }
  SeqId seq() const { return seq_; }

  // The most blocks one sequence holds under `options` when no step exceeds max_step_tokens:
  // what a pool must have per sequence. With kNone, the blocks for max_tokens; never more than
  // those plus 2, since a sequence holds no more slots than it was fed.
  static int max_blocks(const EvictionOptions& options, int block_size, int max_step_tokens, int64_t max_tokens);
  // Blocks a sequence may hold beyond those its live tokens fill: evicted slots not yet dropped
  // (window and streaming: at most 2); 0 for the policies that compact.
  static int evicted_slot_blocks(const EvictionOptions& options);

 private:
  EvictingSequence(LlamaModel& model, KvCacheManager& cache, KvStorage& storage, const EvictionOptions& options,
                   SeqId seq);

  bool keeps_window() const;  // window and streaming: sinks + one contiguous window, no compaction
  // Tokens of the next forward, at most `remaining`.
  int next_step_size(int remaining) const;
  // Evicts so that a step of `step` tokens fits in the budget.
  // False when a shared block could not be copied before compaction wrote it (the pool is
  // full): nothing was evicted, and plan_step answers 0 so the scheduler makes room.
  [[nodiscard]] bool make_room(int step);
  void evict_oldest_window_tokens(int count);
  // Keeps the live slots `kept` (ascending) and compacts them to slots [0, kept.size()).
  [[nodiscard]] bool compact_to(const std::vector<int>& kept);  // false: as make_room
  // Blocks the pool just freed (ref count 0) give their KIVI staging back.
  void release_staging(const std::vector<BlockId>& freed);
  // Copies the shared blocks among table indices [first, end) so this sequence may write them.
  Status make_exclusive(int first_block_idx, int end_block_idx);
  // The first slot whose token is at a text position after `position` (live tokens only; past
  // them, the slot a new token at such a position takes).
  int first_slot_after(int64_t position) const;
  // The first slot the next token's local-layer window reaches; the blocks before it are unpinned.
  void release_local_before_window();
  // The model has sliding-window layers (whether or not the storage keeps only their windows).
  bool has_sliding_window() const { return model_.config().sliding_window.any(); }
  void note_peaks();

  LlamaModel& model_;
  KvCacheManager& cache_;
  KvStorage& storage_;
  EvictionOptions options_;
  SeqId seq_;
  int64_t num_fed_ = 0;
  // Window and streaming: slots [0, num_sinks_) and [window_begin_, num_slots()) are live.
  int num_sinks_ = 0;
  int window_begin_ = 0;
  // H2O and SnapKV: every slot is live; its text position and accumulated attention.
  std::vector<int64_t> slot_positions_;  // [num_slots]
  std::vector<float> slot_scores_;       // [num_slots] (H2O)
  std::vector<float> step_weights_;      // [num_slots] scratch for one forward's weights
  // The step planned and not yet committed: its token count, whether it sums H2O weights
  // and whether SnapKV compresses after it; 0 tokens when none is pending.
  int pending_tokens_ = 0;
  bool pending_h2o_ = false;
  bool pending_snapkv_ = false;
  // SnapKV's compression after a prompt step that found no block to copy a shared one into
  // (another request attached this one's published blocks in the same step): the next
  // plan_step applies it first.
  std::vector<int> deferred_kept_;
  LocalWindowHold local_hold_;
  std::vector<int32_t> local_first_tokens_;  // [pending_tokens_] the planned step's, for local layers
  EvictionStats stats_;
};

}  // namespace kvlm
