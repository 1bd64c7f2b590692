// Per-query first tokens (PagedAttentionArgs::query_first_token: gemma3's local layers under token
// eviction, where slots are not positions): the reference by hand, then the paged kernels of every
// ISA and several codecs against it, alone and with sinks, window_begin, q_sink and token weights.
// Every token no query sees holds NaN and every block no query reads is -1 in the table, so a
// kernel that reads either fails.
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
#include "attention/paged_attention.h"
#include "attention/reference_attention.h"
#include "attention_test_util.h"

namespace kvlm {
namespace {

using testing::AttentionShape;
using testing::max_abs;
using testing::max_abs_diff;
using testing::PagedAttentionFixture;

// Outputs: against the double reference over the stored K/V only f32 rounding differs (as in
// the window and sliding-window tests), 1e-5 of the output's magnitude.
constexpr float kRelTol = 1e-5f;
// Weights (as in attention_weights_test.cc): 1e-5 of the token's reference sum, plus 1e-7 of a
// whole row's weight (1) so that weights near zero do not demand an impossible relative accuracy.
constexpr double kWeightRelTol = 1e-5;
constexpr double kWeightAbsTol = 1e-7;

// ---- The reference itself, by hand ----

TEST(ReferenceFirstToken, FirstTokensCombineWithSinksWindowAndQSinkByHand) {
  // 6 tokens, one head, head_dim 1; queries are tokens 3, 4, 5 with first tokens 0, 3, 5. Sink:
  // token 0 (scored with q_sink); tokens 1 and 2 are evicted (NaN: they must not be read).
  // Query 3 sees {0, 3}, query 4 {3, 4} (the sink is before its first token), query 5 {5}.
  const std::vector<float> q = {1.0f, 1.0f, 1.0f};
  const std::vector<float> q_sink = {2.0f, 2.0f, 2.0f};
  const std::vector<float> k = {1.0f, NAN, NAN, 0.0f, 1.0f, 2.0f};
  const std::vector<float> v = {10.0f, NAN, NAN, 20.0f, 40.0f, 80.0f};
  const std::vector<int32_t> firsts = {0, 3, 5};
  std::vector<double> w;
  const std::vector<float> out = reference_attention(
      {.q = q.data(), .k = k.data(), .v = v.data(), .num_context_tokens = 6, .num_queries = 3, .num_heads = 1,
       .num_kv_heads = 1, .head_dim = 1, .scale = 1.0f, .num_sink_tokens = 1, .window_begin = 3,
       .q_sink = q_sink.data(), .query_first_token = firsts.data(), .weights = &w});
  const double e = std::exp(1.0), e2 = std::exp(2.0);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_NEAR(out[0], (10.0 * e2 + 20.0) / (e2 + 1.0), 1e-5);
  EXPECT_NEAR(out[1], (20.0 + 40.0 * e) / (1.0 + e), 1e-5);
  EXPECT_NEAR(out[2], 80.0, 1e-5);
  ASSERT_EQ(w.size(), 18u);
  EXPECT_NEAR(w[0], e2 / (e2 + 1.0), 1e-12);
  EXPECT_EQ(w[6 + 0], 0.0);  // query 4 no longer sees the sink
  EXPECT_NEAR(w[6 + 3] + w[6 + 4], 1.0, 1e-12);
  EXPECT_EQ(w[12 + 4], 0.0);  // query 5 sees only itself
  EXPECT_EQ(w[12 + 5], 1.0);
}

// ---- The paged kernels against the reference ----

struct FirstTokenCase {
  AttentionShape shape;
  int num_sink_tokens = 0;
  int window_begin = 0;
  bool q_sink = false;
  // Query 0's first token and the last query's (before it is limited to its own token); the
  // queries between step from one to the other, with a jitter of a few tokens (kept monotone).
  int first_begin = 0;
  int first_end = 0;
  int first_weight_query = -1;  // -1: no token weights asked
  std::string name() const {
    return fmt::format("{}_s{}_w{}{}_f{}to{}{}", shape.name(), num_sink_tokens, window_begin,
                       q_sink ? "_qsink" : "", first_begin, first_end,
                       first_weight_query >= 0 ? fmt::format("_fwq{}", first_weight_query) : "");
  }
};

// [num_queries]: non-decreasing, first_begin first, each at most its query's own token.
std::vector<int32_t> first_tokens(const FirstTokenCase& c) {
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

// Whether query i sees token t under the fixture's sinks, window and first tokens (the rule the
// reference implements, restated so the poisoning does not depend on the oracle).
bool sees(const PagedAttentionFixture& f, int i, int t) {
  const int pos = f.shape.num_context_tokens - f.shape.num_queries + i;
  const bool in_window = t < f.num_sink_tokens || t >= f.window_begin;
  const bool after_first = f.query_first_token.empty() || t >= f.query_first_token[static_cast<size_t>(i)];
  return t <= pos && in_window && after_first;
}

// Writes NaN into every token no query sees and releases (-1) every block none of whose tokens
// any query sees; returns the number of blocks released. The stored K/V are reread before the
// table changes, so the reference gets the NaN too (and must not read them either).
int poison_unseen(PagedAttentionFixture& f) {
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
    f.storage->write_token(PagedAttentionFixture::kLayer, block, t % bs, nan.data(), nan.data());
  }
  f.reread_stored();
  int released = 0;
  for (int b = 0; b * bs < T; ++b) {
    const auto first = seen.begin() + b * bs;
    if (std::none_of(first, first + std::min(bs, T - b * bs), [](uint8_t s) { return s != 0; })) {
      f.block_table[static_cast<size_t>(b)] = -1;
      ++released;
    }
  }
  return released;
}

PagedAttentionFixture make_poisoned(const FirstTokenCase& c, uint32_t seed) {
  PagedAttentionFixture f =
      testing::make_eviction_fixture({c.shape, c.num_sink_tokens, c.window_begin, c.q_sink}, seed);
  f.query_first_token = first_tokens(c);
  poison_unseen(f);
  return f;
}

// The head_dims a family takes (AttentionIsa): a case is run on every family that takes its
// head_dim; a family the CPU lacks is then a reported skip.
bool takes_head_dim(AttentionIsa isa, int head_dim) {
  switch (isa) {
    case AttentionIsa::kAvx2:
      return head_dim % 8 == 0;
    case AttentionIsa::kAvx512:
      return head_dim % 16 == 0;
    case AttentionIsa::kPortable:
    case AttentionIsa::kAuto:
      break;
  }
  return true;
}

struct IsaCase {
  FirstTokenCase c;
  AttentionIsa isa = AttentionIsa::kPortable;
  std::string name() const { return fmt::format("{}_{}", c.name(), attention_isa_name(isa)); }
};

// gtest prints a failing case's parameter with this (instead of its bytes).
void PrintTo(const IsaCase& c, std::ostream* os) { *os << c.name(); }

std::vector<IsaCase> on_every_isa(const std::vector<FirstTokenCase>& cases) {
  std::vector<IsaCase> out;
  for (const FirstTokenCase& c : cases) {
    for (AttentionIsa isa : {AttentionIsa::kPortable, AttentionIsa::kAvx2, AttentionIsa::kAvx512}) {
      if (takes_head_dim(isa, c.shape.head_dim)) out.push_back({c, isa});
    }
  }
  return out;
}

// Runs `args` on `isa` (which this CPU must have) and checks that family's kernels ran.
void run_on(const PagedAttentionArgs& args, ThreadPool& pool, AttentionIsa isa) {
  const auto family = isa == AttentionIsa::kAvx512 ? attention_internal::KernelFamily::kAvx512
                      : isa == AttentionIsa::kAvx2 ? attention_internal::KernelFamily::kAvx2
                                                   : attention_internal::KernelFamily::kPortable;
  const uint64_t before = attention_internal::kernel_family_runs(family);
  paged_attention(args, pool, isa);
  EXPECT_GT(attention_internal::kernel_family_runs(family), before) << attention_isa_name(isa) << " did not run";
}

// The codecs every shape runs with. The sanitizer build (CI's second stage, where each case
// costs a process start under ASan) keeps one plain and one KIVI codec: the shapes exercise the
// same first-token code for every codec, and the Release run covers all four.
std::vector<KvType> main_codecs() {
#ifdef KVLM_SANITIZED_BUILD
  return {KvType::kF32, KvType::kKivi4};
#else
  return {KvType::kF32, KvType::kF16, KvType::kInt8, KvType::kKivi4};
#endif
}

std::vector<FirstTokenCase> attention_cases() {
  // 100 or 700 context tokens; with 5 queries the first sits at 95, with 40 at 60. The 700-token
  // decodes split into chunks (flash-decoding) of a few hundred tokens; the 5-query 700-token MQA
  // prefill has two query tiles, the second starting at its own first query's token.
  const FirstTokenCase shapes[] = {
      // query_first_token alone
      {{8, 2, 64, 16, 100, 1}, 0, 0, false, 37, 37},
      {{8, 2, 64, 16, 100, 5}, 0, 0, false, 30, 70},
      {{8, 2, 64, 1, 100, 40}, 0, 0, false, 10, 90},
      {{8, 1, 64, 16, 100, 40}, 0, 0, false, 0, 60},
      {{4, 4, 64, 16, 100, 5}, 0, 0, false, 61, 99},  // the last query sees only itself
      {{8, 2, 8, 16, 100, 5}, 0, 0, false, 20, 50},
      {{8, 2, 64, 16, 100, 40}, 0, 0, false, 30, 40},  // many queries share a first token
      {{8, 2, 64, 16, 700, 1}, 0, 0, false, 150, 150},
      {{8, 1, 64, 16, 700, 5}, 0, 0, false, 100, 400},
      // with sinks [0, 4) and window_begin: decodes whose first token is inside the sinks, in
      // the evicted range, past window_begin
      {{8, 2, 64, 16, 100, 1}, 4, 37, true, 2, 2},
      {{8, 2, 64, 16, 100, 1}, 4, 37, true, 20, 20},
      {{8, 2, 64, 16, 100, 1}, 4, 48, true, 60, 60},
      // prefills whose early queries start inside the sinks and later ones past them (some in
      // the evicted range, some past window_begin)
      {{8, 2, 64, 16, 100, 5}, 4, 37, true, 1, 60},
      {{8, 2, 64, 1, 100, 40}, 4, 48, true, 0, 59},
      {{8, 1, 64, 16, 100, 40}, 4, 37, false, 3, 80},
      {{8, 2, 8, 1, 100, 5}, 4, 37, true, 2, 40},
      // every query past the sinks
      {{4, 4, 64, 16, 100, 5}, 4, 48, true, 10, 80},
      {{8, 2, 64, 16, 100, 40}, 4, 48, true, 50, 90},
      // sinks with nothing evicted (window_begin at or before their end), with and without q_sink
      {{8, 2, 64, 16, 100, 5}, 4, 0, true, 2, 50},
      {{8, 2, 64, 16, 100, 5}, 4, 4, false, 2, 50},
      {{8, 2, 64, 16, 100, 5}, 4, 0, true, 10, 50},  // ... and every query past them
      // sinks over more than a block: the sink blocks wholly before the first token are released
      {{8, 2, 64, 16, 100, 5}, 20, 48, true, 17, 60},
      {{8, 2, 64, 1, 100, 5}, 20, 48, true, 5, 30},
      // long contexts: a sink chunk and window chunks, or window chunks only
      {{8, 2, 64, 16, 700, 1}, 4, 200, true, 2, 2},
      {{8, 2, 64, 16, 700, 1}, 4, 200, true, 300, 300},
      {{8, 1, 64, 16, 700, 5}, 4, 150, true, 1, 400},
  };
  std::vector<FirstTokenCase> cases;
  for (KvType t : main_codecs()) {
    for (FirstTokenCase c : shapes) {
      c.shape.k_type = c.shape.v_type = t;
      cases.push_back(c);
    }
  }
  // The other codecs, mixed K/V codecs, and KIVI with staged (residual) and sealed blocks.
  for (KvType t : {KvType::kBf16, KvType::kFp8, KvType::kInt4, KvType::kKivi2}) {
    cases.push_back({{8, 2, 64, 16, 100, 5, t, t}, 4, 37, true, 1, 60});
  }
  cases.push_back({{8, 2, 64, 16, 100, 5, KvType::kInt8, KvType::kInt4}, 4, 48, true, 2, 70});
  cases.push_back({{8, 2, 64, 16, 100, 5, KvType::kKivi4, KvType::kF16}, 4, 48, true, 2, 70});
  cases.push_back({{8, 2, 64, 16, 100, 4, KvType::kKivi4, KvType::kKivi4, 32}, 4, 40, true, 3, 85});
  return cases;
}

class QueryFirstTokenAttention : public ::testing::TestWithParam<IsaCase> {};

TEST_P(QueryFirstTokenAttention, MatchesReferenceWithoutReadingWhatNoQuerySees) {
  const AttentionIsa isa = GetParam().isa;
  if (resolve_attention_isa(isa, GetParam().c.shape.head_dim) != isa) {
    GTEST_SKIP() << attention_isa_name(isa) << " is not available on this CPU";
  }
  ThreadPool pool(2);
  const PagedAttentionFixture f = make_poisoned(GetParam().c, 2468);
  const std::vector<float> ref = f.run_reference_stored();
  const float scale = std::max(max_abs(ref), 1e-3f);
  EXPECT_LE(max_abs_diff(f.run_paged(pool, isa), ref), kRelTol * scale);
}

INSTANTIATE_TEST_SUITE_P(Cases, QueryFirstTokenAttention, ::testing::ValuesIn(on_every_isa(attention_cases())),
                         [](const auto& info) { return info.param.name(); });

// ---- Token weights (H2O, SnapKV) ----

std::vector<FirstTokenCase> weights_cases() {
  const FirstTokenCase shapes[] = {
      {{8, 2, 64, 16, 100, 1}, 0, 0, false, 37, 37, 0},
      {{8, 2, 64, 16, 100, 7}, 4, 37, true, 1, 60, 0},
      {{8, 2, 64, 16, 100, 7}, 4, 37, true, 1, 60, 4},  // SnapKV: the last queries, past the sinks
      {{8, 1, 64, 1, 100, 40}, 4, 48, true, 0, 59, 10},
      {{4, 4, 64, 16, 100, 5}, 4, 48, false, 10, 80, 0},  // every query past the sinks
      {{8, 2, 8, 16, 100, 5}, 20, 48, true, 17, 60, 0},
      {{8, 2, 64, 16, 700, 1}, 4, 200, true, 2, 2, 0},  // a sink chunk and window chunks
      {{8, 1, 64, 16, 700, 5}, 4, 150, true, 1, 400, 2},
  };
  std::vector<FirstTokenCase> cases;
  for (KvType t : main_codecs()) {
    for (FirstTokenCase c : shapes) {
      c.shape.k_type = c.shape.v_type = t;
      cases.push_back(c);
    }
  }
  cases.push_back({{8, 2, 64, 16, 100, 4, KvType::kKivi4, KvType::kKivi4, 32}, 4, 40, true, 3, 85, 1});
  return cases;
}

// The reference's weights summed as paged_attention sums them (add_token_weights): over the
// queries [first_weight_query, num_queries) and all heads. [num_context_tokens]
std::vector<double> reference_token_sums(const PagedAttentionFixture& f, int first_weight_query) {
  std::vector<double> w;  // [num_queries, num_heads, num_context_tokens]
  f.run_reference_stored(&w);
  const size_t T = static_cast<size_t>(f.shape.num_context_tokens);
  const size_t first_row = static_cast<size_t>(first_weight_query) * static_cast<size_t>(f.shape.num_heads);
  std::vector<double> sums(T, 0.0);
  for (size_t row = first_row; row < w.size() / T; ++row) {
    for (size_t t = 0; t < T; ++t) sums[t] += w[row * T + t];
  }
  return sums;
}

// got: the kernel's token_weights (started at 0). A token no weighted query sees gets exactly 0.
void expect_weights_match(const PagedAttentionFixture& f, int first_weight_query, const std::vector<float>& got) {
  const std::vector<double> want = reference_token_sums(f, first_weight_query);
  ASSERT_EQ(got.size(), want.size());
  for (int t = 0; t < f.shape.num_context_tokens; ++t) {
    const size_t ti = static_cast<size_t>(t);
    ASSERT_NEAR(got[ti], want[ti], kWeightRelTol * want[ti] + kWeightAbsTol) << "token " << t;
    bool seen = false;
    for (int i = first_weight_query; i < f.shape.num_queries; ++i) seen = seen || sees(f, i, t);
    if (!seen) {
      ASSERT_EQ(got[ti], 0.0f) << "token " << t << " no weighted query sees";
    }
  }
  const double total = std::accumulate(got.begin(), got.end(), 0.0);
  EXPECT_NEAR(total, static_cast<double>(f.shape.num_queries - first_weight_query) * f.shape.num_heads, 1e-4);
}

class QueryFirstTokenWeights : public ::testing::TestWithParam<IsaCase> {};

TEST_P(QueryFirstTokenWeights, KernelWeightsMatchReferenceSumsAndOutputIsUnchanged) {
  const AttentionIsa isa = GetParam().isa;
  const FirstTokenCase& c = GetParam().c;
  if (resolve_attention_isa(isa, c.shape.head_dim) != isa) {
    GTEST_SKIP() << attention_isa_name(isa) << " is not available on this CPU";
  }
  ThreadPool pool(2);
  const PagedAttentionFixture f = make_poisoned(c, 1357);
  const std::vector<float> ref = f.run_reference_stored();
  std::vector<float> out(f.q.size(), std::numeric_limits<float>::quiet_NaN());
  std::vector<float> sums(static_cast<size_t>(f.shape.num_context_tokens), 0.0f);
  PagedAttentionArgs args = f.paged_args(out.data());
  args.token_weights = sums.data();
  args.first_weight_query = c.first_weight_query;
  run_on(args, pool, isa);
  EXPECT_LE(max_abs_diff(out, ref), kRelTol * std::max(max_abs(ref), 1e-3f));
  expect_weights_match(f, c.first_weight_query, sums);
}

INSTANTIATE_TEST_SUITE_P(Cases, QueryFirstTokenWeights, ::testing::ValuesIn(on_every_isa(weights_cases())),
                         [](const auto& info) { return info.param.name(); });

// ---- Edges ----

class QueryFirstTokenIsa : public ::testing::TestWithParam<AttentionIsa> {};

// A sliding window is the first tokens p - W + 1 (clamped at 0): the same bits on every family,
// with the blocks before the first window released for both.
TEST_P(QueryFirstTokenIsa, FirstTokensOfASlidingWindowGiveItsBits) {
  const AttentionIsa isa = GetParam();
  if (resolve_attention_isa(isa, 64) != isa) GTEST_SKIP() << attention_isa_name(isa) << " is not available on this CPU";
  ThreadPool pool(2);
  struct Window {
    AttentionShape shape;
    int window;
  };
  const Window windows[] = {{{8, 2, 64, 16, 700, 1, KvType::kF32, KvType::kF32}, 333},
                            {{8, 1, 64, 16, 100, 40, KvType::kF16, KvType::kF16}, 37},
                            {{8, 2, 64, 1, 100, 5, KvType::kInt8, KvType::kInt8}, 7},
                            {{8, 1, 64, 16, 700, 5, KvType::kKivi4, KvType::kKivi4}, 300}};
  for (const Window& w : windows) {
    SCOPED_TRACE(fmt::format("{} window {}", w.shape.name(), w.window));
    PagedAttentionFixture f = PagedAttentionFixture::make(w.shape, 31);
    const int first_query_pos = w.shape.num_context_tokens - w.shape.num_queries;
    for (int i = 0; i < w.shape.num_queries; ++i) {
      f.query_first_token.push_back(std::max(0, first_query_pos + i - w.window + 1));
    }
    EXPECT_GT(poison_unseen(f), 0);
    const std::vector<float> by_first_tokens = f.run_paged(pool, isa);
    const std::vector<float> ref = f.run_reference_stored();
    EXPECT_LE(max_abs_diff(by_first_tokens, ref), kRelTol * std::max(max_abs(ref), 1e-3f));
    f.query_first_token.clear();
    f.sliding_window = w.window;
    EXPECT_EQ(f.run_paged(pool, isa), by_first_tokens);
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, QueryFirstTokenIsa,
                         ::testing::Values(AttentionIsa::kPortable, AttentionIsa::kAvx2, AttentionIsa::kAvx512),
                         [](const auto& info) { return std::string(attention_isa_name(info.param)); });

// The first tokens really cut (the kernels do not merely ignore them), and first tokens of 0
// cut nothing.
TEST(QueryFirstTokenEdges, CutsOnlyWhenPastTheStart) {
  ThreadPool pool(2);
  PagedAttentionFixture f =
      testing::make_eviction_fixture({{8, 2, 64, 16, 100, 5, KvType::kF32, KvType::kF32}, 4, 37, true}, 11);
  const std::vector<float> plain = f.run_paged(pool);
  f.query_first_token.assign(5, 0);
  EXPECT_EQ(f.run_paged(pool), plain);
  f.query_first_token = {2, 10, 40, 60, 99};
  EXPECT_GT(max_abs_diff(f.run_paged(pool), plain), 1e-3f * std::max(max_abs(plain), 1e-3f));
}

// A long H2O step runs as slices of queries (each with its slice of the first tokens): the output
// and the weights equal the whole call's (weights to f32 summation order) and the reference's.
TEST(QueryFirstTokenEdges, SlicedQueriesGiveTheSameOutputAndWeights) {
  ThreadPool pool(2);
  for (int first_weight_query : {0, 5, 23}) {
    SCOPED_TRACE(fmt::format("first weight query {}", first_weight_query));
    const FirstTokenCase c{{8, 2, 64, 16, 150, 40, KvType::kInt8, KvType::kF16}, 4, 40, true, 2, 120};
    const PagedAttentionFixture f = make_poisoned(c, 7);
    std::vector<float> out_whole(f.q.size()), out_sliced(f.q.size()), w_whole(150, 0.0f), w_sliced(150, 0.0f);
    PagedAttentionArgs whole = f.paged_args(out_whole.data());
    whole.token_weights = w_whole.data();
    whole.first_weight_query = first_weight_query;
    paged_attention(whole, pool);
    PagedAttentionArgs sliced = f.paged_args(out_sliced.data());
    sliced.token_weights = w_sliced.data();
    sliced.first_weight_query = first_weight_query;
    // 8 heads x 150 tokens = 1200 floats a query: a limit of 6000 gives slices of 5 queries.
    attention_internal::paged_attention_with_score_limit(sliced, pool, AttentionIsa::kAuto, 6000);
    EXPECT_LE(max_abs_diff(out_whole, out_sliced), 1e-5f * max_abs(out_whole));
    for (size_t t = 0; t < w_whole.size(); ++t) {
      EXPECT_NEAR(w_sliced[t], w_whole[t], 1e-5 * w_whole[t] + 1e-6) << "token " << t;
    }
    expect_weights_match(f, first_weight_query, w_sliced);
  }
}

// The split depends on the shapes only: any thread count gives the same bits, weights included.
TEST(QueryFirstTokenEdges, SameBitsForAnyThreadCount) {
  const PagedAttentionFixture f =
      make_poisoned({{8, 1, 64, 16, 700, 5, KvType::kInt8, KvType::kInt8}, 4, 150, true, 1, 400}, 4);
  auto run = [&](ThreadPool& pool, std::vector<float>& weights) {
    std::vector<float> out(f.q.size());
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

TEST(QueryFirstTokenDeathTest, RejectsFirstTokensOutOfOrderOrPastTheirQueryAndReadBlocksReleased) {
  ThreadPool pool(1);
  // 10 tokens in blocks of 4; queries at tokens 8 and 9.
  const PagedAttentionFixture f = PagedAttentionFixture::make({8, 4, 8, 4, 10, 2, KvType::kF32, KvType::kF32}, 3);
  std::vector<float> out(f.q.size());
  const PagedAttentionArgs args = f.paged_args(out.data());
  // `firsts` is a temporary of the statement that calls paged_attention: it lives until the call returns.
  auto with_firsts = [&](const std::vector<int32_t>& firsts, auto change) {
    PagedAttentionArgs a = args;
    a.query_first_token = firsts.data();
    change(a);
    return a;
  };
  auto same = [](PagedAttentionArgs&) {};
  EXPECT_DEATH(paged_attention(with_firsts({5, 3}, same), pool), "query 1 first token 3 must lie in");
  EXPECT_DEATH(paged_attention(with_firsts({9, 9}, same), pool),
               "query 0 first token 9 must lie in \\[previous query's, 8\\]");
  EXPECT_DEATH(paged_attention(with_firsts({0, 10}, same), pool), "query 1 first token 10");
  EXPECT_DEATH(paged_attention(with_firsts({-1, 0}, same), pool), "query 0 first token -1");
  EXPECT_DEATH(paged_attention(with_firsts({0, 0}, [](auto& a) { a.sliding_window = 3; }), pool),
               "does not combine with .*query_first_token");

  // A block some query reads may not be released: block 1 holds token 5, the first query's first.
  std::vector<int32_t> table = f.block_table;
  table[0] = -1;
  table[1] = -1;
  EXPECT_DEATH(paged_attention(with_firsts({5, 6}, [&](auto& a) { a.block_table = table.data(); }), pool),
               "block_table\\[1\\] = -1");
  // With sink [0, 2) and the window from 6, a first token of 1 reads block 0 (the sink token 1).
  table = f.block_table;
  table[0] = -1;
  EXPECT_DEATH(paged_attention(with_firsts({1, 7},
                                           [&](auto& a) {
                                             a.block_table = table.data();
                                             a.num_sink_tokens = 2;
                                             a.window_begin = 6;
                                           }),
                               pool),
               "block_table\\[0\\] = -1");
}

}  // namespace
}  // namespace kvlm
