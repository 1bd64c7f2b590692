#include "attention_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include <fmt/format.h>

#include "attention/attention_kernel.h"
#include "attention/query_rounding.h"
#include "kv/hadamard.h"

namespace kvlm::testing {

std::string AttentionShape::name() const {
  return fmt::format("h{}_kv{}_d{}_bs{}_ctx{}_q{}_{}_{}{}{}{}", num_heads, num_kv_heads, head_dim, block_size,
                     num_context_tokens, num_queries, kv_type_name(k_type), kv_type_name(v_type),
                     kivi_residual > 0 ? fmt::format("_r{}", kivi_residual) : "",
                     latent_value_dim > 0 ? fmt::format("_latent{}", latent_value_dim) : "",
                     rotate_keys ? (*rotate_keys ? "_rot" : "_norot") : "");
}

PagedAttentionFixture PagedAttentionFixture::make(const AttentionShape& s, uint32_t seed, float q_gain) {
  PagedAttentionFixture f;
  f.shape = s;
  f.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const KvLayout layout{.num_layers = 2, .num_kv_heads = s.num_kv_heads, .head_dim = s.head_dim,
                        .block_size = s.block_size, .latent_value_dim = s.latent_value_dim};
  const bool latent = layout.is_latent();
  const int needed = (s.num_context_tokens + s.block_size - 1) / s.block_size;
  const int num_blocks = 2 * needed + 3;
  auto created = KvStorage::create(layout, s.k_type, s.v_type, num_blocks,
                                   {.kivi_residual_tokens = s.kivi_residual, .rotate_keys = s.rotate_keys});
  EXPECT_TRUE(created.ok()) << created.status().message();
  f.storage = std::move(created).value();

  const size_t width = layout.values_per_token();
  const std::vector<float> nan(width, std::numeric_limits<float>::quiet_NaN());
  const float* nan_v = latent ? nullptr : nan.data();  // a latent layout writes its rows only
  for (int layer = 0; layer < 2; ++layer) {
    for (int b = 0; b < num_blocks; ++b) {
      for (int slot = 0; slot < s.block_size; ++slot) f.storage->write_token(layer, BlockId(b), slot, nan.data(), nan_v);
    }
  }

  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  f.block_table.assign(ids.begin(), ids.begin() + needed);

  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  f.q.resize(static_cast<size_t>(s.num_queries) * s.num_heads * s.head_dim);
  for (float& x : f.q) x = q_gain * dist(rng);
  f.k.resize(static_cast<size_t>(s.num_context_tokens) * width);
  for (float& x : f.k) x = dist(rng);
  const size_t value_width = latent ? static_cast<size_t>(s.value_dim()) : width;
  f.v.resize(static_cast<size_t>(s.num_context_tokens) * value_width);
  if (latent) {
    for (int t = 0; t < s.num_context_tokens; ++t) {
      const float* row = f.k.data() + static_cast<size_t>(t) * width;
      std::copy(row, row + value_width, f.v.data() + static_cast<size_t>(t) * value_width);
    }
  } else {
    for (float& x : f.v) x = dist(rng);
  }
  f.k_stored.resize(f.k.size());
  f.v_stored.resize(f.v.size());
  for (int t = 0; t < s.num_context_tokens; ++t) {
    const BlockId block(f.block_table[static_cast<size_t>(t / s.block_size)]);
    const size_t off = static_cast<size_t>(t) * width;
    f.storage->write_token(kLayer, block, t % s.block_size, f.k.data() + off, latent ? nullptr : f.v.data() + off);
  }
  // KIVI: full blocks outside the residual window are encoded now; the rest stay staged.
  f.storage->seal_full_blocks(kLayer, f.block_table.data(), s.num_context_tokens);
  f.reread_stored();
  return f;
}

void PagedAttentionFixture::reread_stored() {
  const KvLayout& layout = storage->layout();
  const size_t width = layout.values_per_token();
  const size_t value_width = layout.is_latent() ? static_cast<size_t>(layout.value_dim()) : width;
  for (int t = 0; t < shape.num_context_tokens; ++t) {
    const BlockId block(block_table[static_cast<size_t>(t / shape.block_size)]);
    storage->read_token(kLayer, block, t % shape.block_size, k_stored.data() + static_cast<size_t>(t) * width,
                        v_stored.data() + static_cast<size_t>(t) * value_width);
  }
}

void PagedAttentionFixture::make_q_sink(uint32_t seed, float q_gain) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  q_sink.resize(q.size());
  for (float& x : q_sink) x = q_gain * dist(rng);
}

void PagedAttentionFixture::poison_evicted() {
  const std::vector<float> nan(storage->layout().values_per_token(), std::numeric_limits<float>::quiet_NaN());
  const float* nan_v = storage->layout().is_latent() ? nullptr : nan.data();
  for (int t = num_sink_tokens; t < window_begin; ++t) {
    const BlockId block(block_table[static_cast<size_t>(t / shape.block_size)]);
    storage->write_token(kLayer, block, t % shape.block_size, nan.data(), nan_v);
  }
  reread_stored();
}

size_t PagedAttentionFixture::out_floats() const {
  return static_cast<size_t>(shape.num_queries) * static_cast<size_t>(shape.num_heads) *
         static_cast<size_t>(shape.value_dim());
}

PagedAttentionArgs PagedAttentionFixture::paged_args(float* out) const {
  PagedAttentionArgs args;
  args.storage = storage.get();
  args.layer = kLayer;
  args.block_table = block_table.data();
  args.num_table_blocks = static_cast<int>(block_table.size());
  args.num_context_tokens = shape.num_context_tokens;
  args.num_queries = shape.num_queries;
  args.num_heads = shape.num_heads;
  args.q = q.data();
  args.out = out;
  args.scale = scale;
  args.num_sink_tokens = num_sink_tokens;
  args.window_begin = window_begin;
  args.q_sink = q_sink.empty() ? nullptr : q_sink.data();
  args.sliding_window = sliding_window;
  args.query_first_token = query_first_token.empty() ? nullptr : query_first_token.data();
  return args;
}

std::vector<float> PagedAttentionFixture::run_paged(ThreadPool& pool, AttentionIsa isa) const {
  std::vector<float> out(out_floats(), std::numeric_limits<float>::quiet_NaN());
  // The family the call resolves to must be the one whose kernels run (the witness counts).
  const AttentionIsa resolved = resolve_attention_isa(isa, shape.head_dim, shape.value_dim());
  const auto family = resolved == AttentionIsa::kAvx512 ? attention_internal::KernelFamily::kAvx512
                      : resolved == AttentionIsa::kAvx2 ? attention_internal::KernelFamily::kAvx2
                                                        : attention_internal::KernelFamily::kPortable;
  const uint64_t before = attention_internal::kernel_family_runs(family);
  paged_attention(paged_args(out.data()), pool, isa);
  EXPECT_GT(attention_internal::kernel_family_runs(family), before)
      << attention_isa_name(resolved) << " resolved but its kernels did not run";
  return out;
}

// The stored keys come back in the model's space (read_token rotates them back); a storage that
// keeps them rotated is scored by the kernels with rotated queries, which is also where they
// round their queries. The stored-space reference therefore works in the rotated space too.
// Values stay in the model's space (a latent layout's: the model-space rows' prefixes, which
// is what the kernels' un-rotated outputs are sums of).
static std::vector<float> reference(const PagedAttentionFixture& f, const std::vector<float>& k_given,
                                    const std::vector<float>& v, std::vector<double>* weights, bool round_queries,
                                    bool storage_space = true) {
  std::vector<float> q = f.q, q_sink = f.q_sink, k = k_given;
  if (storage_space && f.storage->keys_rotated()) {
    const int d = f.shape.head_dim;
    hadamard_rotate_heads(q.data(), static_cast<int>(q.size()) / d, d);
    if (!q_sink.empty()) hadamard_rotate_heads(q_sink.data(), static_cast<int>(q_sink.size()) / d, d);
    hadamard_rotate_heads(k.data(), static_cast<int>(k.size()) / d, d);
  }
  ReferenceAttentionArgs a;
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.num_context_tokens = f.shape.num_context_tokens;
  a.num_queries = f.shape.num_queries;
  a.num_heads = f.shape.num_heads;
  a.num_kv_heads = f.shape.num_kv_heads;
  a.head_dim = f.shape.head_dim;
  a.value_dim = f.shape.value_dim();
  a.scale = f.scale;
  a.num_sink_tokens = f.num_sink_tokens;
  a.window_begin = f.window_begin;
  a.q_sink = q_sink.empty() ? nullptr : q_sink.data();
  a.sliding_window = f.sliding_window;
  a.query_first_token = f.query_first_token.empty() ? nullptr : f.query_first_token.data();
  a.weights = weights;
  a.round_queries = round_queries;
  return reference_attention(a);
}

std::vector<float> PagedAttentionFixture::run_reference_stored(std::vector<double>* weights) const {
  return reference(*this, k_stored, v_stored, weights, query_rounding::rounds_queries(shape.k_type));
}
std::vector<float> PagedAttentionFixture::run_reference_stored_exact_queries() const {
  return reference(*this, k_stored, v_stored, nullptr, false);
}
std::vector<float> PagedAttentionFixture::run_reference_original() const {
  return reference(*this, k, v, nullptr, false, /*storage_space=*/false);
}

float max_abs(const std::vector<float>& x) {
  float m = 0.0f;
  for (float e : x) m = std::max(m, std::fabs(e));
  return m;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::numeric_limits<float>::infinity();
  float m = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) {
    const float d = std::fabs(a[i] - b[i]);
    if (std::isnan(d)) return std::numeric_limits<float>::infinity();
    m = std::max(m, d);
  }
  return m;
}

std::string EvictionCase::name() const {
  return fmt::format("{}_s{}_w{}{}", shape.name(), num_sink_tokens, window_begin, q_sink ? "_qsink" : "");
}

PagedAttentionFixture make_eviction_fixture(const EvictionCase& c, uint32_t seed) {
  PagedAttentionFixture f = PagedAttentionFixture::make(c.shape, seed);
  f.num_sink_tokens = c.num_sink_tokens;
  f.window_begin = c.window_begin;
  if (c.q_sink) f.make_q_sink(seed + 1);
  return f;
}

}  // namespace kvlm::testing
