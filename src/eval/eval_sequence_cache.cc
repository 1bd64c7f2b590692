#include "eval/eval_sequence_cache.h"

#include <optional>

#include "cache/kv_cache_manager.h"
#include "core/check.h"
#include "engine/release_sequence.h"
#include "kv/kv_storage.h"

namespace kvlm {
namespace {

// Every token stays: slot i holds the token at position i.
class FullEvalCache final : public EvalSequenceCache {
 public:
  FullEvalCache(LlamaModel& model, ThreadPool& pool, std::unique_ptr<KvStorage> storage, int num_blocks,
                int block_size)
      : model_(model), pool_(pool), storage_(std::move(storage)), manager_(num_blocks, block_size) {}

  void forward(std::span<const TokenId> tokens, LogitsRows rows, std::vector<float>& logits) override {
    if (!seq_) seq_ = manager_.create_sequence();
    const int n = static_cast<int>(tokens.size());
    KVLM_CHECK(manager_.reserve(*seq_, n), "full cache of {} blocks cannot take {} tokens after {}",
               manager_.num_blocks(), n, num_fed_);
    const BlockTable& table = manager_.table(*seq_);
    model_.forward(SequenceStep{tokens, static_cast<int>(num_fed_), table.block_ids(), rows}, *storage_, pool_,
                   logits);
    manager_.append(*seq_, n);
    num_fed_ += n;
  }

  void reset() override {
    if (seq_) release_sequence(manager_, *storage_, *seq_);
    seq_.reset();
    num_fed_ = 0;
  }

  int64_t num_fed() const override { return num_fed_; }
  int64_t num_cached() const override { return num_fed_; }
  int num_blocks_held() const override { return manager_.num_used_blocks(); }
  uint64_t bytes_per_block() const override { return storage_->bytes_per_block(); }

 private:
  LlamaModel& model_;
  ThreadPool& pool_;
  std::unique_ptr<KvStorage> storage_;
  KvCacheManager manager_;
  std::optional<SeqId> seq_;
  int64_t num_fed_ = 0;
};

}  // namespace

Result<std::unique_ptr<EvalSequenceCache>> make_full_eval_cache(LlamaModel& model, ThreadPool& pool,
                                                                const EvalCacheRequest& request) {
  const EvalCacheOptions& o = request.options;
  if (o.block_size < 1 || o.block_size > 4096) {
    return Status::errorf("--block-size {} must be in [1, 4096]", o.block_size);
  }
  if (request.max_tokens < 1 || request.max_tokens > (int64_t{1} << 30)) {
    return Status::errorf("a full cache for {} tokens is out of range", request.max_tokens);
  }
  const int64_t num_blocks = (request.max_tokens + o.block_size - 1) / o.block_size;
  const ModelConfig& c = model.config();
  const KvLayout layout = c.kv_layout(o.block_size);
  KVLM_ASSIGN_OR_RETURN(std::unique_ptr<KvStorage> storage,
                        KvStorage::create(layout, o.k_type, o.v_type, static_cast<int>(num_blocks), o.storage));
  return std::unique_ptr<EvalSequenceCache>(
      new FullEvalCache(model, pool, std::move(storage), static_cast<int>(num_blocks), o.block_size));
}

Result<std::unique_ptr<EvalSequenceCache>> make_eval_cache(const EvalCacheFactory& factory, LlamaModel& model,
                                                           ThreadPool& pool, const EvalCacheRequest& request) {
  if (factory) return factory(model, pool, request);
  return make_full_eval_cache(model, pool, request);
}

}  // namespace kvlm
