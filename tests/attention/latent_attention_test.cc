// Paged attention over MLA latent rows (KvLayout::is_latent): one cached row per token read as the key,
// whose first value_dim values are the value, against the reference for every codec but KIVI and
// every kernel family, with sinks, windows, first tokens, token weights, chunks and key rotation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <ostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "attention/attention_kernel.h"
#include "attention/attention_weights.h"
#include "attention/paged_attention.h"
#include "attention/reference_attention.h"
#include "attention_test_util.h"
#include "kv/hadamard.h"

namespace kvlm {
namespace {

using testing::AttentionShape;
using testing::max_abs;
using testing::max_abs_diff;
using testing::PagedAttentionFixture;

// Against the double reference over the stored rows (queries rounded as the kernels round them
// for int8 and int4 rows) only f32 rounding differs: 1e-5 of the output's magnitude, as in
// quantized_attention_test.cc.
constexpr float kRelTol = 1e-5f;
// Token weights, as in attention_weights_test.cc.
constexpr double kWeightRelTol = 1e-5;
constexpr double kWeightAbsTol = 1e-7;

// (head_dim, value_dim): small shapes whose rotation block (16) tiles value_dim, and
// DeepSeek-V2-Lite's 512 + 64 row.
constexpr std::pair<int, int> kLatentDims[] = {{48, 32}, {80, 64}, {576, 512}};

// Every codec a latent row can use (not KIVI). The sanitizer build keeps a plain one and the two
// integer-q·k ones: the shapes run the same latent code for each.
std::vector<KvType> latent_codecs() {
#ifdef KVLM_SANITIZED_BUILD
  return {KvType::kF16, KvType::kInt8, KvType::kInt4};
#else
  return {KvType::kF32, KvType::kF16, KvType::kBf16, KvType::kFp8, KvType::kInt8, KvType::kInt4};
#endif
}

AttentionShape latent_shape(int heads, int head_dim, int value_dim, int block_size, int context, int queries,
                            KvType type) {
  AttentionShape s{heads, 1, head_dim, block_size, context, queries, type, type};
  s.latent_value_dim = value_dim;
  return s;
}

attention_internal::KernelFamily family_of(AttentionIsa isa) {
  return isa == AttentionIsa::kAvx512 ? attention_internal::KernelFamily::kAvx512
         : isa == AttentionIsa::kAvx2 ? attention_internal::KernelFamily::kAvx2
                                      : attention_internal::KernelFamily::kPortable;
}

// Whether a family takes these sizes (AttentionIsa); a case runs on each family that does.
bool takes(AttentionIsa isa, int head_dim, int value_dim) {
  switch (isa) {
    case AttentionIsa::kAvx2:
      return head_dim % 8 == 0 && value_dim % 8 == 0;
    case AttentionIsa::kAvx512:
      return head_dim % 16 == 0 && value_dim % 16 == 0;
    case AttentionIsa::kPortable:
    case AttentionIsa::kAuto:
      break;
  }
  return true;
}

constexpr AttentionIsa kFamilies[] = {AttentionIsa::kPortable, AttentionIsa::kAvx2, AttentionIsa::kAvx512};

bool cpu_has(AttentionIsa isa, const AttentionShape& s) {
  return resolve_attention_isa(isa, s.head_dim, s.value_dim()) == isa;
}

// Runs `args` on `isa` (which this CPU must have) and checks that its family's kernels ran.
void run_on(const PagedAttentionArgs& args, ThreadPool& pool, AttentionIsa isa) {
  const uint64_t before = attention_internal::kernel_family_runs(family_of(isa));
  paged_attention(args, pool, isa);
  EXPECT_GT(attention_internal::kernel_family_runs(family_of(isa)), before)
      << attention_isa_name(isa) << " did not run";
}

// ---- The reference's latent form ----

TEST(ReferenceLatentAttention, ValuesFromKeyPrefixesEqualExplicitValues) {
  // 2 heads over 5 tokens of rows [4 values]: the value is the rows' first 3.
  const int T = 5, D = 4, Dv = 3;
  std::vector<float> q(2 * D), k(T * D), v(T * Dv);
  for (size_t i = 0; i < q.size(); ++i) q[i] = 0.3f * static_cast<float>(i) - 1.0f;
  for (size_t i = 0; i < k.size(); ++i) k[i] = std::sin(static_cast<float>(i));
  for (int t = 0; t < T; ++t) std::copy(&k[t * D], &k[t * D] + Dv, &v[t * Dv]);
  ReferenceAttentionArgs a{.q = q.data(), .k = k.data(), .v = v.data(), .num_context_tokens = T, .num_queries = 1,
                           .num_heads = 2, .num_kv_heads = 1, .head_dim = D, .value_dim = Dv, .scale = 0.5f};
  const std::vector<float> explicit_values = reference_attention(a);
  ASSERT_EQ(explicit_values.size(), 2u * Dv);
  a.v = nullptr;
  EXPECT_EQ(reference_attention(a), explicit_values);
  // One token: its value exactly.
  a.num_context_tokens = 1;
  EXPECT_EQ(reference_attention(a), (std::vector<float>{k[0], k[1], k[2], k[0], k[1], k[2]}));
}

// ---- Every codec, shape and family ----

struct LatentCase {
  AttentionShape shape;
  AttentionIsa isa = AttentionIsa::kPortable;
  std::string name() const { return fmt::format("{}_{}", shape.name(), attention_isa_name(isa)); }
};

void PrintTo(const LatentCase& c, std::ostream* os) { *os << c.name(); }

std::vector<LatentCase> on_every_family(const std::vector<AttentionShape>& shapes) {
  std::vector<LatentCase> out;
  for (const AttentionShape& s : shapes) {
    for (AttentionIsa isa : kFamilies) {
      if (takes(isa, s.head_dim, s.value_dim())) out.push_back({s, isa});
    }
  }
  return out;
}

std::vector<AttentionShape> latent_shapes() {
  struct Combo {
    int heads, block_size, context, queries;
  };
  // Decode and prefill (1, 7, 33 queries), one to 16 heads, blocks of 1, 16 and 64; the 700-token
  // decodes are split into flash-decoding chunks, the 33-query prefills into query tiles.
#ifdef KVLM_SANITIZED_BUILD
  const Combo combos[] = {{1, 16, 100, 1}, {4, 1, 60, 7}, {16, 64, 700, 1}};
#else
  const Combo combos[] = {{1, 16, 100, 1},  {4, 1, 60, 7},   {16, 64, 700, 1},
                          {16, 16, 120, 33}, {4, 64, 700, 33}, {16, 1, 700, 7}};
#endif
  std::vector<AttentionShape> shapes;
  for (KvType t : latent_codecs()) {
    for (auto [d, dv] : kLatentDims) {
      for (const Combo& c : combos) {
        shapes.push_back(latent_shape(c.heads, d, dv, c.block_size, c.context, c.queries, t));
      }
    }
  }
  // int8 and int4 rows are rotated by default (all three shapes allow it): the same unrotated, and
  // f32 rows rotated (exact codes: what differs is the rotation alone).
  for (auto [d, dv] : kLatentDims) {
    for (KvType t : {KvType::kInt8, KvType::kInt4, KvType::kF32}) {
      for (const Combo& c : {Combo{16, 16, 700, 1}, Combo{4, 1, 100, 7}}) {
        AttentionShape s = latent_shape(c.heads, d, dv, c.block_size, c.context, c.queries, t);
        s.rotate_keys = t == KvType::kF32;
        shapes.push_back(s);
      }
    }
  }
  // Rotation blocks that do not tile value_dim (16 vs 40, 32 vs 48): the default leaves the rows
  // unrotated. 40 values are no whole avx512 register: that family does not take them.
  for (auto [d, dv] : {std::pair{48, 40}, std::pair{96, 48}}) {
    for (KvType t : {KvType::kInt8, KvType::kInt4, KvType::kF16}) {
      shapes.push_back(latent_shape(4, d, dv, 16, 100, 7, t));
      shapes.push_back(latent_shape(16, d, dv, 16, 700, 1, t));
    }
  }
  return shapes;
}

class LatentAttention : public ::testing::TestWithParam<LatentCase> {};

TEST_P(LatentAttention, MatchesReferenceOnStoredRows) {
  const LatentCase& c = GetParam();
  if (!cpu_has(c.isa, c.shape)) GTEST_SKIP() << attention_isa_name(c.isa) << " is not available on this CPU";
  ThreadPool pool(2);
  const PagedAttentionFixture f = PagedAttentionFixture::make(c.shape, 9753);
  const bool rotation_fits = c.shape.value_dim() % hadamard_block(c.shape.head_dim) == 0;
  const bool default_rotation = c.shape.k_type == KvType::kInt8 || c.shape.k_type == KvType::kInt4;
  EXPECT_EQ(f.storage->keys_rotated(), rotation_fits && c.shape.rotate_keys.value_or(default_rotation));
  const std::vector<float> ref = f.run_reference_stored();
  ASSERT_EQ(ref.size(), f.out_floats());
  const std::vector<float> out = f.run_paged(pool, c.isa);  // asserts that the family ran
  EXPECT_LE(max_abs_diff(out, ref), kRelTol * std::max(max_abs(ref), 1e-3f));
}

INSTANTIATE_TEST_SUITE_P(Shapes, LatentAttention, ::testing::ValuesIn(on_every_family(latent_shapes())),
                         [](const auto& info) { return info.param.name(); });

// ---- Sinks, windows, first tokens and token weights ----

struct FeatureCase {
  AttentionShape shape;
  int num_sink_tokens = 0;
  int window_begin = 0;
  bool q_sink = false;
  int first_begin = -1;  // query_first_token from first_begin (query 0) to first_end (the last); -1: none
  int first_end = -1;
  int sliding_window = 0;
  int first_weight_query = -1;  // -1: no token weights
  AttentionIsa isa = AttentionIsa::kPortable;
  std::string name() const {
    return fmt::format("{}_s{}_w{}{}{}{}{}_{}", shape.name(), num_sink_tokens, window_begin, q_sink ? "_qsink" : "",
                       first_begin >= 0 ? fmt::format("_f{}to{}", first_begin, first_end) : "",
                       sliding_window > 0 ? fmt::format("_sw{}", sliding_window) : "",
                       first_weight_query >= 0 ? fmt::format("_fwq{}", first_weight_query) : "",
                       attention_isa_name(isa));
  }
};

void PrintTo(const FeatureCase& c, std::ostream* os) { *os << c.name(); }

std::vector<FeatureCase> feature_cases() {
  const FeatureCase shapes[] = {
      // a sink chunk (scored with q_sink) and window chunks; weights of every query
      {latent_shape(16, 576, 512, 16, 700, 1, KvType::kF32), 4, 200, true, -1, -1, 0, 0},
      // prefills with sinks, an evicted range, first tokens and SnapKV's last queries weighted
      {latent_shape(4, 80, 64, 16, 100, 7, KvType::kF32), 4, 37, true, 1, 60, 0, 2},
      {latent_shape(16, 48, 32, 1, 100, 33, KvType::kF32), 4, 48, false, -1, -1, 0, 10},
      {latent_shape(16, 576, 512, 16, 300, 33, KvType::kF32), 4, 100, true, 2, 200, 0, 0},
      // first tokens alone over a long context: chunks start at each tile's first token
      {latent_shape(16, 576, 512, 64, 700, 7, KvType::kF32), 0, 0, false, 100, 400, 0, 0},
      // sliding windows (gemma-like local layers; harmless for latents)
      {latent_shape(16, 576, 512, 16, 700, 1, KvType::kF32), 0, 0, false, -1, -1, 333, -1},
      {latent_shape(4, 80, 64, 16, 100, 33, KvType::kF32), 0, 0, false, -1, -1, 37, -1},
  };
#ifdef KVLM_SANITIZED_BUILD
  const KvType types[] = {KvType::kF16, KvType::kInt4};
#else
  const KvType types[] = {KvType::kF16, KvType::kFp8, KvType::kInt8, KvType::kInt4};
#endif
  std::vector<FeatureCase> cases;
  for (KvType t : types) {
    for (FeatureCase c : shapes) {
      c.shape.k_type = c.shape.v_type = t;
      for (AttentionIsa isa : kFamilies) {
        if (!takes(isa, c.shape.head_dim, c.shape.value_dim())) continue;
        c.isa = isa;
        cases.push_back(c);
      }
    }
  }
  return cases;
}

// [num_queries]: non-decreasing from first_begin to first_end with a small jitter, each at most
// its query's own token.
std::vector<int32_t> first_tokens(const FeatureCase& c) {
  const int nq = c.shape.num_queries;
  const int first_query_pos = c.shape.num_context_tokens - nq;
  std::vector<int32_t> firsts(static_cast<size_t>(nq));
  for (int i = 0; i < nq; ++i) {
    const int line = nq == 1 ? c.first_begin : c.first_begin + (c.first_end - c.first_begin) * i / (nq - 1);
    const int jitter = i == 0 || i == nq - 1 ? 0 : (i * 7) % 5 - 2;
    int f = std::max(0, line + jitter);
    if (i > 0) f = std::max(f, firsts[static_cast<size_t>(i - 1)]);
    firsts[static_cast<size_t>(i)] = std::min(f, first_query_pos + i);
  }
  return firsts;
}

bool sees(const PagedAttentionFixture& f, int i, int t) {
  const int pos = f.shape.num_context_tokens - f.shape.num_queries + i;
  return t <= pos && (t < f.num_sink_tokens || t >= f.window_begin) &&
         (f.sliding_window == 0 || pos - t < f.sliding_window) &&
         (f.query_first_token.empty() || t >= f.query_first_token[static_cast<size_t>(i)]);
}

// Writes NaN rows into every token no query sees and releases (-1) the blocks no query reads,
// so that a kernel reading either fails.
void poison_unseen(PagedAttentionFixture& f) {
  const int T = f.shape.num_context_tokens;
  const int bs = f.shape.block_size;
  std::vector<uint8_t> seen(static_cast<size_t>(T), 0);
  for (int i = 0; i < f.shape.num_queries; ++i) {
    for (int t = 0; t < T; ++t) seen[static_cast<size_t>(t)] |= sees(f, i, t) ? 1 : 0;
  }
  const std::vector<float> nan(f.storage->layout().values_per_token(), std::numeric_limits<float>::quiet_NaN());
  for (int t = 0; t < T; ++t) {
    if (seen[static_cast<size_t>(t)]) continue;
    const BlockId block(f.block_table[static_cast<size_t>(t / bs)]);
    f.storage->write_token(PagedAttentionFixture::kLayer, block, t % bs, nan.data(), nullptr);
  }
  f.reread_stored();
  for (int b = 0; b * bs < T; ++b) {
    const auto first = seen.begin() + b * bs;
    if (std::none_of(first, first + std::min(bs, T - b * bs), [](uint8_t s) { return s != 0; })) {
      f.block_table[static_cast<size_t>(b)] = -1;
    }
  }
}

PagedAttentionFixture make_feature_fixture(const FeatureCase& c, uint32_t seed) {
  PagedAttentionFixture f =
      testing::make_eviction_fixture({c.shape, c.num_sink_tokens, c.window_begin, c.q_sink}, seed);
  if (c.first_begin >= 0) f.query_first_token = first_tokens(c);
  f.sliding_window = c.sliding_window;
  return f;
}

// The reference's weights summed over queries [first_weight_query, num_queries) and all heads.
std::vector<double> reference_token_sums(const PagedAttentionFixture& f, int first_weight_query) {
  std::vector<double> w;  // [num_queries, num_heads, num_context_tokens]
  f.run_reference_stored(&w);
  const size_t T = static_cast<size_t>(f.shape.num_context_tokens);
  std::vector<double> sums(T, 0.0);
  for (size_t row = static_cast<size_t>(first_weight_query) * f.shape.num_heads; row < w.size() / T; ++row) {
    for (size_t t = 0; t < T; ++t) sums[t] += w[row * T + t];
  }
  return sums;
}

void expect_weights_match(const PagedAttentionFixture& f, int first_weight_query, const std::vector<float>& got) {
  const std::vector<double> want = reference_token_sums(f, first_weight_query);
  ASSERT_EQ(got.size(), want.size());
  for (size_t t = 0; t < want.size(); ++t) {
    ASSERT_NEAR(got[t], want[t], kWeightRelTol * want[t] + kWeightAbsTol) << "token " << t;
  }
  const double total = std::accumulate(got.begin(), got.end(), 0.0);
  EXPECT_NEAR(total, static_cast<double>(f.shape.num_queries - first_weight_query) * f.shape.num_heads, 1e-4);
}

class LatentAttentionFeatures : public ::testing::TestWithParam<FeatureCase> {};

TEST_P(LatentAttentionFeatures, MatchesReferenceWithoutReadingWhatNoQuerySees) {
  const FeatureCase& c = GetParam();
  if (!cpu_has(c.isa, c.shape)) GTEST_SKIP() << attention_isa_name(c.isa) << " is not available on this CPU";
  ThreadPool pool(2);
  PagedAttentionFixture f = make_feature_fixture(c, 2468);
  poison_unseen(f);
  const std::vector<float> ref = f.run_reference_stored();
  std::vector<float> out(f.out_floats(), std::numeric_limits<float>::quiet_NaN());
  std::vector<float> sums(static_cast<size_t>(f.shape.num_context_tokens), 0.0f);
  PagedAttentionArgs args = f.paged_args(out.data());
  if (c.first_weight_query >= 0) {
    args.token_weights = sums.data();
    args.first_weight_query = c.first_weight_query;
  }
  run_on(args, pool, c.isa);
  EXPECT_LE(max_abs_diff(out, ref), kRelTol * std::max(max_abs(ref), 1e-3f));
  if (c.first_weight_query >= 0) expect_weights_match(f, c.first_weight_query, sums);
}

INSTANTIATE_TEST_SUITE_P(Cases, LatentAttentionFeatures, ::testing::ValuesIn(feature_cases()),
                         [](const auto& info) { return info.param.name(); });

// ---- Key rotation ----

class LatentRotation : public ::testing::TestWithParam<AttentionIsa> {};

// The rotation changes what int8 and int4 round, nothing else: rotated and unrotated rows give the
// same output within the codec's error, both near the exact attention over the rows as written, so
// the rotated output is rotated back (left rotated, it would be off by the output's own size).
TEST_P(LatentRotation, RotatedRowsGiveTheUnrotatedOutputWithinTheCodecBound) {
  const AttentionIsa isa = GetParam();
  ThreadPool pool(2);
  for (auto [d, dv] : kLatentDims) {
    for (KvType t : {KvType::kF32, KvType::kInt8, KvType::kInt4}) {
      AttentionShape shape = latent_shape(16, d, dv, 16, 300, 3, t);
      if (!cpu_has(isa, shape)) GTEST_SKIP() << attention_isa_name(isa) << " is not available on this CPU";
      SCOPED_TRACE(shape.name());
      shape.rotate_keys = true;
      const PagedAttentionFixture rotated = PagedAttentionFixture::make(shape, 77, 2.0f);
      shape.rotate_keys = false;
      const PagedAttentionFixture plain = PagedAttentionFixture::make(shape, 77, 2.0f);
      ASSERT_TRUE(rotated.storage->keys_rotated());
      ASSERT_FALSE(plain.storage->keys_rotated());
      const std::vector<float> exact = plain.run_reference_original();
      const float magnitude = max_abs(exact);
      // Relative to the output's size: f32 codes differ by the rotation's f32 rounding alone;
      // int8 and int4 by their codecs (as ErrorAgainstOriginalShrinksWithBits bounds them).
      const float bound = (t == KvType::kF32 ? 1e-5f : t == KvType::kInt8 ? 0.02f : 0.2f) * magnitude;
      const std::vector<float> out_rotated = rotated.run_paged(pool, isa);
      const std::vector<float> out_plain = plain.run_paged(pool, isa);
      EXPECT_LE(max_abs_diff(out_rotated, exact), bound);
      EXPECT_LE(max_abs_diff(out_plain, exact), bound);
      EXPECT_LE(max_abs_diff(out_rotated, out_plain), bound);
      if (t != KvType::kF32) {
        EXPECT_GT(max_abs_diff(out_rotated, out_plain), 0.0f) << "the rotation changes the codes";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, LatentRotation, ::testing::ValuesIn(kFamilies),
                         [](const auto& info) { return std::string(attention_isa_name(info.param)); });

// ---- The weights side pass, slicing, threads ----

// accumulate_attention_weights reads K alone: over latent rows it gives the reference's sums.
TEST(LatentAttentionWeights, SidePassMatchesReferenceSums) {
  ThreadPool pool(2);
  for (KvType t : latent_codecs()) {
    for (auto [d, dv] : kLatentDims) {
      SCOPED_TRACE(fmt::format("{} d{} dv{}", kv_type_name(t), d, dv));
      PagedAttentionFixture f =
          testing::make_eviction_fixture({latent_shape(16, d, dv, 16, 300, 5, t), 4, 100, true}, 5);
      f.poison_evicted();
      std::vector<float> sums(300, 0.0f);
      accumulate_attention_weights(f.paged_args(nullptr), sums, pool);
      expect_weights_match(f, 0, sums);
    }
  }
}

// A long H2O step runs as slices of queries (their outputs value_dim wide): the same output and
// weights as the whole call.
TEST(LatentAttentionEdges, SlicedQueriesGiveTheSameOutputAndWeights) {
  ThreadPool pool(2);
  for (int first_weight_query : {0, 5, 23}) {
    SCOPED_TRACE(fmt::format("first weight query {}", first_weight_query));
    PagedAttentionFixture f =
        testing::make_eviction_fixture({latent_shape(16, 80, 64, 16, 150, 40, KvType::kInt8), 4, 40, true}, 7);
    f.poison_evicted();
    std::vector<float> out_whole(f.out_floats()), out_sliced(f.out_floats()), w_whole(150, 0.0f), w_sliced(150, 0.0f);
    PagedAttentionArgs whole = f.paged_args(out_whole.data());
    whole.token_weights = w_whole.data();
    whole.first_weight_query = first_weight_query;
    paged_attention(whole, pool);
    PagedAttentionArgs sliced = f.paged_args(out_sliced.data());
    sliced.token_weights = w_sliced.data();
    sliced.first_weight_query = first_weight_query;
    // 16 heads x 150 tokens = 2400 floats a query: a limit of 12000 gives slices of 5 queries.
    attention_internal::paged_attention_with_score_limit(sliced, pool, AttentionIsa::kAuto, 12000);
    EXPECT_LE(max_abs_diff(out_whole, out_sliced), 1e-5f * max_abs(out_whole));
    const std::vector<float> ref = f.run_reference_stored();
    EXPECT_LE(max_abs_diff(out_sliced, ref), kRelTol * max_abs(ref));
    for (size_t t = 0; t < w_whole.size(); ++t) {
      EXPECT_NEAR(w_sliced[t], w_whole[t], 1e-5 * w_whole[t] + 1e-6) << "token " << t;
    }
    expect_weights_match(f, first_weight_query, w_sliced);
  }
}

// DeepSeek-V2-Lite's decode: the split depends on the shapes only, so any thread count gives the
// same bits, weights included.
TEST(LatentAttentionEdges, SameBitsForAnyThreadCount) {
  const PagedAttentionFixture f = PagedAttentionFixture::make(latent_shape(16, 576, 512, 16, 700, 1, KvType::kInt8), 4);
  auto run = [&](ThreadPool& pool, std::vector<float>& weights) {
    std::vector<float> out(f.out_floats());
    weights.assign(700, 0.0f);
    PagedAttentionArgs args = f.paged_args(out.data());
    args.token_weights = weights.data();
    paged_attention(args, pool);
    return out;
  };
  ThreadPool one(1), three(3);
  std::vector<float> w1, w3;
  EXPECT_EQ(run(one, w1), run(three, w3));
  EXPECT_EQ(w1, w3);
}

TEST(LatentAttentionEdges, FamiliesNeedValueDimInWholeRegisters) {
  EXPECT_EQ(resolve_attention_isa(AttentionIsa::kAvx512, 48, 40), AttentionIsa::kPortable);  // 40 % 16 != 0
  EXPECT_EQ(resolve_attention_isa(AttentionIsa::kAvx2, 48, 36), AttentionIsa::kPortable);    // 36 % 8 != 0
  EXPECT_EQ(resolve_attention_isa(AttentionIsa::kPortable, 576, 512), AttentionIsa::kPortable);
  const KvLayout layout{.num_layers = 1, .num_kv_heads = 1, .head_dim = 48, .block_size = 16, .latent_value_dim = 40};
  EXPECT_EQ(resolve_attention_isa(AttentionIsa::kAvx512, layout), AttentionIsa::kPortable);
}

}  // namespace
}  // namespace kvlm
