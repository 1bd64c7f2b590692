#include "model/llama_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "attention/paged_attention.h"
#include "core/check.h"
#include "core/page_cache.h"
#include "gguf/gguf_file.h"
#include "kv/kv_storage.h"
#include "model/mla_attention.h"
#include "model/moe_ffn.h"
#include "model/scratch_vector.h"
#include "model/tokenizer_gguf.h"
#include "ops/elementwise.h"

namespace kvlm {
namespace {

void add_bias(float* x, const std::vector<float>& bias, int64_t num_tokens) {
  if (bias.empty()) return;
  const size_t n = bias.size();
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (size_t i = 0; i < n; ++i) x[t * n + i] += bias[i];
  }
}

void add_into(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

}  // namespace

LlamaModel::~LlamaModel() = default;

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

Result<std::unique_ptr<LlamaModel>> LlamaModel::load(const std::string& path) {
  const auto start = std::chrono::steady_clock::now();
  // Measured before the mapping: open() reads the header and metadata pages itself.
  const Result<uint64_t> resident = page_cache_resident_bytes(path);
  KVLM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::open(path));
  KVLM_ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model, from_file(std::move(file)));
  model->load_stats_.resident_bytes_before = resident.ok() ? *resident : 0;
  model->load_stats_.copied_bytes = model->weights_.copied_bytes();
  model->load_stats_.seconds = seconds_since(start);
  return model;
}

Result<std::unique_ptr<LlamaModel>> LlamaModel::load_from_bytes(std::vector<uint8_t> bytes, std::string name) {
  const auto start = std::chrono::steady_clock::now();
  KVLM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::from_bytes(std::move(bytes), std::move(name)));
  KVLM_ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model, from_file(std::move(file)));
  // The bytes are already in memory, and kvlm's own copy of them.
  model->load_stats_.resident_bytes_before = model->file_->file_size();
  model->load_stats_.copied_bytes = model->file_->file_size() + model->weights_.copied_bytes();
  model->load_stats_.mapped = false;
  model->load_stats_.seconds = seconds_since(start);
  return model;
}

Result<std::unique_ptr<LlamaModel>> LlamaModel::from_file(std::unique_ptr<GgufFile> file) {
  std::unique_ptr<LlamaModel> model(new LlamaModel());
  model->file_ = std::move(file);
  model->load_stats_.file_bytes = model->file_->file_size();
  const std::string& name = model->file_->name();
  KVLM_ASSIGN_OR_RETURN(model->config_, ModelConfig::from_gguf(*model->file_));
  KVLM_ASSIGN_OR_RETURN(model->weights_, LlamaWeights::bind(*model->file_, model->config_));
  KVLM_ASSIGN_OR_RETURN(TokenizerVocab vocab, load_tokenizer_vocab(*model->file_));
  if (static_cast<int>(vocab.tokens.size()) != model->config_.vocab_size) {
    return Status::errorf("{}: tokenizer has {} tokens but the embedding has {} rows", name, vocab.tokens.size(),
                          model->config_.vocab_size);
  }
  auto tokenizer = Tokenizer::create(std::move(vocab));
  if (!tokenizer.ok()) return tokenizer.status().with_context(name);
  model->tokenizer_ = std::move(tokenizer).value();
  return model;
}

void LlamaModel::forward(const SequenceStep& step, KvStorage& cache, ThreadPool& pool, std::vector<float>& logits) {
  forward_batch(std::span<const SequenceStep>(&step, 1), cache, pool, logits);
}

void LlamaModel::forward_batch(std::span<const SequenceStep> steps, KvStorage& cache, ThreadPool& pool,
                               std::vector<float>& logits) {
  const ModelConfig& c = config_;
  KVLM_CHECK(!steps.empty(), "forward needs at least one sequence");
  const KvLayout& layout = cache.layout();
  const KvLayout expected = c.kv_layout(layout.block_size);
  KVLM_CHECK(layout.num_layers == expected.num_layers && layout.num_kv_heads == expected.num_kv_heads &&
                 layout.head_dim == expected.head_dim && layout.latent_value_dim == expected.latent_value_dim,
             "cache layout {}x{}x{} (latent values {}) does not match the model {}x{}x{} (latent values {})",
             layout.num_layers, layout.num_kv_heads, layout.head_dim, layout.latent_value_dim, expected.num_layers,
             expected.num_kv_heads, expected.head_dim, expected.latent_value_dim);
  const int block_size = layout.block_size;
  // A storage that keeps only the windows of local layers must agree with the model on which they are.
  if (cache.has_local_layers()) {
    for (int l = 0; l < c.num_layers; ++l) {
      KVLM_CHECK(cache.is_local_layer(l) == c.is_local_layer(l), "layer {} is {} in the model but {} in the cache", l,
                 c.is_local_layer(l) ? "local" : "global", cache.is_local_layer(l) ? "local" : "global");
    }
  }

  // Token t of the batch: its text position, and its position within the cache when its
  // sequence's sinks are scored with a second rotation (once tokens were evicted).
  int64_t n = 0;
  int64_t num_logits_rows = 0;
  for (const SequenceStep& step : steps) n += static_cast<int64_t>(step.tokens.size());
  positions_.resize(static_cast<size_t>(n));
  sink_positions_.resize(static_cast<size_t>(n));
  bool any_sink_queries = false;
  {
    int64_t t = 0;
    for (const SequenceStep& step : steps) {
      const int64_t len = static_cast<int64_t>(step.tokens.size());
      KVLM_CHECK(len > 0, "forward needs at least one token per sequence");
      const int64_t num_context = step.num_cached_tokens + len;
      KVLM_CHECK(static_cast<int64_t>(step.block_table.size()) * block_size >= num_context,
                 "block table of {} blocks cannot hold {} tokens", step.block_table.size(), num_context);
      const int64_t first_position = step.first_position >= 0 ? step.first_position : step.num_cached_tokens;
      const bool sink_queries = step.first_sink_query_position >= 0;
      KVLM_CHECK(!sink_queries || step.num_sink_tokens > 0, "sink queries at {} without sinks",
                 step.first_sink_query_position);
      KVLM_CHECK(first_position + len <= int64_t{std::numeric_limits<Position>::max()}, "position {} is too large",
                 first_position + len);
      KVLM_CHECK(step.slot_weights == nullptr || (step.num_weight_queries >= 1 && step.num_weight_queries <= len),
                 "{} weight queries in a step of {} tokens", step.num_weight_queries, len);
      // Local layers mask by position: without local_first_tokens, slots must be positions.
      KVLM_CHECK(!c.sliding_window.any() || !step.local_first_tokens.empty() ||
                     (first_position == step.num_cached_tokens && !sink_queries && step.slot_weights == nullptr &&
                      step.num_sink_tokens == 0 && step.window_begin == 0),
                 "a step under token eviction (first position {} at slot {}, {} sinks, window from {}) needs "
                 "local_first_tokens for the sliding-window layers",
                 first_position, step.num_cached_tokens, step.num_sink_tokens, step.window_begin);
      KVLM_CHECK(step.local_first_tokens.empty() || static_cast<int64_t>(step.local_first_tokens.size()) == len,
                 "{} local first tokens for a step of {} tokens", step.local_first_tokens.size(), len);
      any_sink_queries = any_sink_queries || sink_queries;
      for (int64_t i = 0; i < len; ++i, ++t) {
        positions_[static_cast<size_t>(t)] = first_position + i;
        sink_positions_[static_cast<size_t>(t)] = sink_queries ? step.first_sink_query_position + i : -1;
        const TokenId id = step.tokens[static_cast<size_t>(i)];
        KVLM_CHECK(id >= 0 && id < c.vocab_size, "token id {} outside the vocabulary of {}", id, c.vocab_size);
      }
      num_logits_rows += step.logits_rows == LogitsRows::kLast ? 1 : len;
    }
  }

  x_.resize(static_cast<size_t>(n * c.dim));
  xn_.resize(x_.size());
  proj_.resize(x_.size());
  q_.resize(static_cast<size_t>(n * c.q_dim()));
  if (any_sink_queries) q_sink_.resize(q_.size());
  att_.resize(q_.size());
  k_.resize(static_cast<size_t>(n * c.kv_dim()));
  v_.resize(k_.size());

  {
    int64_t t = 0;
    for (const SequenceStep& step : steps) {
      for (TokenId id : step.tokens) dequantize_weight_row(weights_.token_embd, id, &x_[static_cast<size_t>(t++ * c.dim)]);
    }
  }
  if (c.embedding_scale != 1.0f) {
    for (float& value : x_) value *= c.embedding_scale;
  }

  // out[t] = RMSNorm(in[t]) for every token; in and out may be the same buffer.
  auto rms_norm_rows = [&](const std::vector<float>& in, const std::vector<float>& weight, std::vector<float>& out) {
    pool.parallel_for(n, 16, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        rms_norm(&in[static_cast<size_t>(t * c.dim)], weight.data(), &out[static_cast<size_t>(t * c.dim)], c.dim,
                 c.rms_eps);
      }
    });
  };

  // Each sequence's table as the local layers' slots, from the first block its queries see
  // there (earlier entries -1): pins do not change during a forward, so once for all layers.
  if (cache.has_local_layers()) {
    local_tables_.resize(steps.size());
    for (size_t i = 0; i < steps.size(); ++i) {
      const SequenceStep& step = steps[i];
      const int64_t len = static_cast<int64_t>(step.tokens.size());
      const int first_token = step.local_first_tokens.empty()
                                  ? static_cast<int>(std::max<int64_t>(
                                        0, step.num_cached_tokens - c.sliding_window.window + 1))
                                  : step.local_first_tokens[0];
      const int first_block = first_token / block_size;
      const int needed = static_cast<int>((step.num_cached_tokens + len + block_size - 1) / block_size);
      local_tables_[i].assign(step.block_table.size(), -1);
      cache.local_block_table(step.block_table, first_block, needed - first_block, local_tables_[i].data() + first_block);
    }
  }

  // Per token, the attention's output: heads × head_dim, or MLA's heads × latent mixes.
  const int64_t att_stride = static_cast<int64_t>(c.num_heads) * expected.value_dim();
  for (int l = 0; l < c.num_layers; ++l) {
    const LlamaLayerWeights& w = weights_.layers[static_cast<size_t>(l)];
    rms_norm_rows(x_, w.attn_norm, xn_);
    if (c.is_mla() && mla_mode_ == MlaMode::kExpanded) {
      mla_cache_rows(c, w, xn_.data(), n, positions_.data(), pool, mla_, k_.data());
      mla_queries(c, w, xn_.data(), n, pool, mla_);
      attend_expanded(l, steps, cache, pool);
      matmul(w.wo, mla_.heads.data(), proj_.data(), n, pool);
    } else if (c.is_mla()) {
      // The cache rows (k_), and the absorbed queries (q_, q_sink_): attention is MQA over the rows.
      mla_cache_rows(c, w, xn_.data(), n, positions_.data(), pool, mla_, k_.data());
      mla_absorbed_queries(c, w, xn_.data(), n, positions_.data(), sink_positions_.data(), pool, mla_, q_.data(),
                           any_sink_queries ? q_sink_.data() : nullptr);
      attend(l, steps, att_stride, cache, pool);
      mla_output(c, w, att_.data(), n, pool, mla_, proj_.data());
    } else {
      project_qkv(l, n, any_sink_queries, pool);
      attend(l, steps, att_stride, cache, pool);
      matmul(w.wo, att_.data(), proj_.data(), n, pool);
    }
    if (c.has_post_norms) rms_norm_rows(proj_, w.post_attn_norm, proj_);
    add_into(x_.data(), proj_.data(), n * c.dim);

    rms_norm_rows(x_, w.ffn_norm, xn_);
    if (c.moe.is_moe_layer(l)) {
      moe_ffn(c, w, xn_.data(), n, pool, moe_, proj_.data());
    } else {
      gated_ffn(w.w_gate, w.w_up, w.w_down, c.ffn_activation, xn_.data(), n, pool, ffn_, proj_.data());
    }
    if (c.has_post_norms) rms_norm_rows(proj_, w.post_ffn_norm, proj_);
    add_into(x_.data(), proj_.data(), n * c.dim);
  }
  kv_projections_computed_ += static_cast<uint64_t>(n);
  // The rows whose logits are wanted, packed at the front of xn_.
  int64_t row = 0;
  int64_t first = 0;
  for (const SequenceStep& step : steps) {
    const int64_t len = static_cast<int64_t>(step.tokens.size());
    const int64_t from = step.logits_rows == LogitsRows::kLast ? len - 1 : 0;
    for (int64_t t = first + from; t < first + len; ++t, ++row) {
      rms_norm(&x_[static_cast<size_t>(t * c.dim)], weights_.output_norm.data(),
               &xn_[static_cast<size_t>(row * c.dim)], c.dim, c.rms_eps);
    }
    first += len;
  }
  logits.resize(static_cast<size_t>(num_logits_rows * c.vocab_size));
  matmul(weights_.output, xn_.data(), logits.data(), num_logits_rows, pool);
}

// q_, k_, v_ (and q_sink_) of the llama block: projections, biases, q/k norms, RoPE.
void LlamaModel::project_qkv(int l, int64_t n, bool any_sink_queries, ThreadPool& pool) {
  const ModelConfig& c = config_;
  const LlamaLayerWeights& w = weights_.layers[static_cast<size_t>(l)];
  const MatmulOutput qkv[] = {{&w.wq, q_.data()}, {&w.wk, k_.data()}, {&w.wv, v_.data()}};
  matmul_shared_input(qkv, xn_.data(), n, pool);
  add_bias(q_.data(), w.bq, n);
  add_bias(k_.data(), w.bk, n);
  add_bias(v_.data(), w.bv, n);
  if (c.has_qk_norm) {
    // Each head of q and k is normalized on its own, before RoPE (qwen3, gemma3).
    pool.parallel_for(n, 8, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        float* q = &q_[static_cast<size_t>(t * c.q_dim())];
        float* k = &k_[static_cast<size_t>(t * c.kv_dim())];
        for (int h = 0; h < c.num_heads; ++h) {
          float* head = q + static_cast<int64_t>(h) * c.head_dim;
          rms_norm(head, w.q_norm.data(), head, c.head_dim, c.rms_eps);
        }
        for (int h = 0; h < c.num_kv_heads; ++h) {
          float* head = k + static_cast<int64_t>(h) * c.head_dim;
          rms_norm(head, w.k_norm.data(), head, c.head_dim, c.rms_eps);
        }
      }
    });
  }

  // Keys are stored already rotated with their position, so cached keys never need work again.
  // (A codec's own rotation of keys and queries, KvStorage::keys_rotated, is the KV side's.)
  if (any_sink_queries) std::copy(q_.begin(), q_.end(), q_sink_.begin());
  const RopeParams& rope = c.layer_rope(l);
  pool.parallel_for(n, 8, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const Position pos = static_cast<Position>(positions_[static_cast<size_t>(t)]);
      float* q = &q_[static_cast<size_t>(t * c.q_dim())];
      float* k = &k_[static_cast<size_t>(t * c.kv_dim())];
      rope_apply(rope, q, c.num_heads, pos);
      rope_apply(rope, k, c.num_kv_heads, pos);
      const int64_t sink_pos = sink_positions_[static_cast<size_t>(t)];
      if (sink_pos >= 0) {
        float* q_sink = &q_sink_[static_cast<size_t>(t * c.q_dim())];
        rope_apply(rope, q_sink, c.num_heads, static_cast<Position>(sink_pos));
      }
    }
  });
}

// Per sequence: writes its new K/V (or MLA rows) from k_/v_ into the cache, then attends with
// q_ over its blocks into att_ (att_stride floats per token).
void LlamaModel::attend(int l, std::span<const SequenceStep> steps, int64_t att_stride, KvStorage& cache,
                        ThreadPool& pool) {
  const ModelConfig& c = config_;
  const bool local = c.is_local_layer(l);
  int64_t first = 0;  // the sequence's first token in the batch
  for (const SequenceStep& step : steps) {
    const int64_t len = static_cast<int64_t>(step.tokens.size());
    const int64_t num_context = step.num_cached_tokens + len;
    // KIVI encodes each block as the residual window leaves it (the write is all there is for other codecs).
    cache.write_tokens(l, step.block_table, step.num_cached_tokens, static_cast<int>(len),
                       &k_[static_cast<size_t>(first * c.kv_dim())],
                       c.is_mla() ? nullptr : &v_[static_cast<size_t>(first * c.kv_dim())]);

    PagedAttentionArgs args;
    args.storage = &cache;
    args.layer = l;
    args.block_table = step.block_table.data();
    args.num_table_blocks = static_cast<int>(step.block_table.size());
    const bool by_slot = step.local_first_tokens.empty();  // slots are positions
    if (local && cache.is_local_layer(l)) {
      args.block_table = local_tables_[static_cast<size_t>(&step - steps.data())].data();
    }
    args.num_context_tokens = static_cast<int>(num_context);
    args.num_queries = static_cast<int>(len);
    args.num_heads = c.num_heads;
    args.q = &q_[static_cast<size_t>(first * c.q_dim())];
    args.out = &att_[static_cast<size_t>(first * att_stride)];
    args.scale = c.attention_scale;
    // A local layer sees the last `window` positions: by slot, or as the step says.
    args.sliding_window = local && by_slot ? c.sliding_window.window : 0;
    args.query_first_token = local && !by_slot ? step.local_first_tokens.data() : nullptr;
    args.num_sink_tokens = step.num_sink_tokens;
    args.window_begin = step.window_begin;
    args.q_sink = sink_positions_[static_cast<size_t>(first)] >= 0 ? &q_sink_[static_cast<size_t>(first * c.q_dim())]
                                                                   : nullptr;
    args.token_weights = step.slot_weights;  // summed over layers, as it accumulates
    args.first_weight_query = step.slot_weights != nullptr ? static_cast<int>(len) - step.num_weight_queries : 0;
    paged_attention(args, pool);
    first += len;
  }
}

// MLA expanded (mla_expanded.h): per sequence, writes its rows from k_, then attends over every
// head's expanded keys and values with the queries in mla_.q into mla_.heads.
void LlamaModel::attend_expanded(int l, std::span<const SequenceStep> steps, KvStorage& cache, ThreadPool& pool) {
  const ModelConfig& c = config_;
  const MlaConfig& m = c.mla;
  int64_t total = 0;
  for (const SequenceStep& step : steps) total += static_cast<int64_t>(step.tokens.size());
  grow_scratch(mla_.heads, total * c.num_heads * m.v_head_dim);
  int64_t first = 0;
  for (const SequenceStep& step : steps) {
    const int64_t len = static_cast<int64_t>(step.tokens.size());
    KVLM_CHECK(step.num_sink_tokens == 0 && step.window_begin == 0 && step.slot_weights == nullptr &&
                   step.first_sink_query_position < 0 && (step.first_position < 0 || step.first_position == step.num_cached_tokens),
               "expanded MLA attends causally over every cached token: no eviction");
    cache.write_tokens(l, step.block_table, step.num_cached_tokens, static_cast<int>(len),
                       &k_[static_cast<size_t>(first * c.kv_dim())], nullptr);
    mla_expanded_attention(c, weights_.layers[static_cast<size_t>(l)], cache, l, step.block_table,
                           static_cast<int>(step.num_cached_tokens + len), static_cast<int>(len),
                           mla_.q.data() + first * c.num_heads * m.qk_head_dim(), positions_.data() + first, pool,
                           mla_expanded_, mla_.heads.data() + first * c.num_heads * m.v_head_dim);
    first += len;
  }
}

}  // namespace kvlm
