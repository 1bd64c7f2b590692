// Test helpers for attention: a paged KV cache filled with random K/V, and error measures.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attention/paged_attention.h"
#include "attention/reference_attention.h"
#include "kv/kv_storage.h"

namespace kvlm::testing {

struct AttentionShape {
  int num_heads = 8;
  int num_kv_heads = 4;
  int head_dim = 64;
  int block_size = 16;
  int num_context_tokens = 17;
  int num_queries = 1;
  KvType k_type = KvType::kF32;
  KvType v_type = KvType::kF32;
  int kivi_residual = 0;  // KvStorageOptions::kivi_residual_tokens
  // KvLayout::latent_value_dim (MLA: num_kv_heads 1, no V; the value is K's prefix); 0 = none.
  int latent_value_dim = 0;
  std::optional<bool> rotate_keys = std::nullopt;  // KvStorageOptions::rotate_keys
  int value_dim() const { return latent_value_dim > 0 ? latent_value_dim : head_dim; }
  std::string name() const;
};

// One sequence's K/V written into a 2-layer storage at layer 1 through a shuffled,
// non-contiguous block table. Every slot that is not part of the context (other
// blocks, the tail of the last block, all of layer 0) holds NaN, so a kernel that
// reads a wrong slot poisons its output.
struct PagedAttentionFixture {
  AttentionShape shape;
  std::unique_ptr<KvStorage> storage;
  std::vector<int32_t> block_table;
  std::vector<float> q;         // [num_queries, num_heads, head_dim]
  // [num_context_tokens, num_kv_heads, head_dim] as written; a latent layout's v is k's
  // prefixes, [num_context_tokens, value_dim] (only k is written).
  std::vector<float> k, v;
  std::vector<float> k_stored;  // the same after the codec's rounding (read back)
  std::vector<float> v_stored;
  float scale = 0.0f;
  // Sinks and window passed to both the kernel and the reference (see PagedAttentionArgs);
  // q_sink empty means none.
  int num_sink_tokens = 0;
  int window_begin = 0;
  std::vector<float> q_sink;  // [num_queries, num_heads, head_dim] or empty
  int sliding_window = 0;     // PagedAttentionArgs::sliding_window, for both
  std::vector<int32_t> query_first_token;  // PagedAttentionArgs::query_first_token, for both: [num_queries] or empty
  static constexpr int kLayer = 1;

  // q_gain scales the queries: larger gains make the softmax peakier.
  static PagedAttentionFixture make(const AttentionShape& shape, uint32_t seed, float q_gain = 8.0f);

  // Reads k_stored/v_stored back from the storage (after sealing or rewriting).
  void reread_stored();

  // Random sink queries (the same distribution as q).
  void make_q_sink(uint32_t seed, float q_gain = 8.0f);
  // Writes NaN into K and V of the evicted slots [num_sink_tokens, window_begin) and
  // rereads the stored K/V, so that a kernel reading them poisons its output. A sealed
  // KIVI block is staged again by the write, with its other slots unchanged.
  void poison_evicted();

  // The kernel's arguments for this fixture (out may be null).
  PagedAttentionArgs paged_args(float* out) const;
  // Floats of one call's output: [num_queries, num_heads, value_dim].
  size_t out_floats() const;
  std::vector<float> run_paged(ThreadPool& pool, AttentionIsa isa = AttentionIsa::kAuto) const;
  // The double-precision reference on the stored (codec-rounded) K/V, with the queries
  // rounded as the kernels round them for this key type (query_rounding.h); `weights`, when
  // given, receives the softmax weights (ReferenceAttentionArgs::weights).
  std::vector<float> run_reference_stored(std::vector<double>* weights = nullptr) const;
  // The same with exact queries, and the exact queries on the original K/V.
  std::vector<float> run_reference_stored_exact_queries() const;
  std::vector<float> run_reference_original() const;
};

// A shape with sinks and a window: the cases of the window and weights tests.
struct EvictionCase {
  AttentionShape shape;
  int num_sink_tokens = 0;
  int window_begin = 0;
  bool q_sink = false;
  std::string name() const;
};

// The fixture of a case: its K/V and queries, the sinks and window set, and random sink
// queries (seed + 1) when the case has them.
PagedAttentionFixture make_eviction_fixture(const EvictionCase& c, uint32_t seed);

float max_abs(const std::vector<float>& x);
// max |a - b|; infinity when either holds a NaN.
float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace kvlm::testing
