#include "eval/evicting_eval_cache.h"

#include <algorithm>
#include <optional>

#include "cache/kv_cache_manager.h"
#include "core/check.h"
#include "evict/evicting_sequence.h"
#include "kv/kv_storage.h"

namespace kvlm {
namespace {

class EvictingEvalCache final : public EvalSequenceCache {
 public:
  EvictingEvalCache(LlamaModel& model, ThreadPool& pool, std::unique_ptr<KvStorage> storage, int num_blocks,
                    int block_size, const EvictionOptions& eviction)
      : model_(model), pool_(pool), storage_(std::move(storage)), manager_(num_blocks, block_size),
        eviction_(eviction) {}
  ~EvictingEvalCache() override { sequence_.reset(); }

  void forward(std::span<const TokenId> tokens, LogitsRows rows, std::vector<float>& logits) override {
    if (!sequence_) sequence_ = std::make_unique<EvictingSequence>(model_, manager_, *storage_, eviction_);
    const Status status = sequence_->forward(tokens, rows, pool_, logits);
    peak_blocks_ = std::max(peak_blocks_, sequence_->stats().peak_blocks);
    peak_live_ = std::max(peak_live_, sequence_->stats().peak_live_tokens);
    // The pool is sized from the policy's own bound and the evaluations validate tokens.
    KVLM_CHECK(status.ok(), "evicting eval cache: {}", status.message());
  }
  void reset() override { sequence_.reset(); }

  int64_t num_fed() const override { return sequence_ ? sequence_->num_fed() : 0; }
  int64_t num_cached() const override { return sequence_ ? sequence_->num_live() : 0; }
  int num_blocks_held() const override { return manager_.num_used_blocks(); }
  uint64_t bytes_per_block() const override { return storage_->bytes_per_block(); }
  int peak_blocks_held() const override { return std::max(peak_blocks_, num_blocks_held()); }
  int64_t peak_cached() const override { return std::max<int64_t>(peak_live_, num_cached()); }

 private:
  LlamaModel& model_;
  ThreadPool& pool_;
  std::unique_ptr<KvStorage> storage_;
  KvCacheManager manager_;
  EvictionOptions eviction_;
  int peak_blocks_ = 0;  // over every sequence since the cache was made
  int peak_live_ = 0;
  std::unique_ptr<EvictingSequence> sequence_;  // declared last: released before the pool it holds blocks of
};

}  // namespace

EvalCacheFactory make_evicting_eval_cache(const EvictionOptions& eviction) {
  if (eviction.policy == EvictionPolicy::kNone) return {};
  return [eviction](LlamaModel& model, ThreadPool& pool,
                    const EvalCacheRequest& request) -> Result<std::unique_ptr<EvalSequenceCache>> {
    KVLM_RETURN_IF_ERROR(validate_eviction_options(eviction));
    const EvalCacheOptions& o = request.options;
    if (o.block_size < 1 || o.block_size > 4096) {
      return Status::errorf("--block-size {} must be in [1, 4096]", o.block_size);
    }
    if (request.max_tokens < 1 || request.max_tokens > (int64_t{1} << 30)) {
      return Status::errorf("an evicting cache for {} tokens is out of range", request.max_tokens);
    }
    // SnapKV runs a prompt step whole: the evaluations feed at most a chunk at a time, but the
    // chunk is theirs to choose, so allow a step as long as the whole input (capped by the budget rule).
    const int max_step = static_cast<int>(std::min<int64_t>(request.max_tokens, int64_t{1} << 20));
    const int num_blocks = EvictingSequence::max_blocks(eviction, o.block_size, max_step, request.max_tokens);
    const ModelConfig& c = model.config();
    const KvLayout layout = c.kv_layout(o.block_size);
    KVLM_ASSIGN_OR_RETURN(std::unique_ptr<KvStorage> storage,
                          KvStorage::create(layout, o.k_type, o.v_type, num_blocks, o.storage));
    return std::unique_ptr<EvalSequenceCache>(
        new EvictingEvalCache(model, pool, std::move(storage), num_blocks, o.block_size, eviction));
  };
}

}  // namespace kvlm
