// Sliding-window attention (gemma3's local layers): each query sees only its last W tokens.
// The reference by hand, then the paged kernels of every ISA and codec against it, with the
// tokens before the window poisoned and the blocks wholly before it absent from the table.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
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

// Against the double reference over the decoded K/V only f32 rounding differs (as in the
// window and quantized attention tests).
constexpr float kRelTol = 1e-5f;

TEST(ReferenceSlidingWindow, EachQueryKeepsItsLastWTokensByHand) {
  // 5 tokens, 3 queries (tokens 2, 3, 4), window 2: query 2 sees {1, 2}, query 3 {2, 3},
  // query 4 {3, 4}; token 0 is seen by none (NaN: it must not be read).
  const std::vector<float> q = {1.0f, 1.0f, 1.0f};
  const std::vector<float> k = {NAN, 0.0f, 1.0f, 2.0f, 0.0f};
  const std::vector<float> v = {NAN, 1.0f, 2.0f, 4.0f, 8.0f};
  std::vector<double> w;
  const std::vector<float> out = reference_attention({.q = q.data(), .k = k.data(), .v = v.data(),
                                                      .num_context_tokens = 5, .num_queries = 3, .num_heads = 1,
                                                      .num_kv_heads = 1, .head_dim = 1, .scale = 1.0f,
                                                      .sliding_window = 2, .weights = &w});
  const double e = std::exp(1.0), e2 = std::exp(2.0);
  EXPECT_NEAR(out[0], (1.0 + 2.0 * e) / (1.0 + e), 1e-5);
  EXPECT_NEAR(out[1], (2.0 * e + 4.0 * e2) / (e + e2), 1e-5);
  EXPECT_NEAR(out[2], (4.0 * e2 + 8.0) / (e2 + 1.0), 1e-5);
  ASSERT_EQ(w.size(), 15u);
  EXPECT_EQ(w[0], 0.0);
  EXPECT_EQ(w[5 + 1], 0.0);   // query 3 no longer sees token 1
  EXPECT_EQ(w[10 + 2], 0.0);  // query 4 no longer sees token 2
}

TEST(ReferenceSlidingWindow, WindowOfTheWholeContextIsPlainCausal) {
  PagedAttentionFixture f = PagedAttentionFixture::make({4, 2, 16, 16, 40, 5, KvType::kF32, KvType::kF32}, 3);
  const std::vector<float> plain = f.run_reference_stored();
  f.sliding_window = 40;  // the last query (at 39) still sees token 0: nothing changes
  EXPECT_EQ(max_abs_diff(f.run_reference_stored(), plain), 0.0f);
  f.sliding_window = 39;  // now it does not
  EXPECT_GT(max_abs_diff(f.run_reference_stored(), plain), 0.0f);
}

struct SlidingCase {
  AttentionShape shape;
  int window = 0;
  std::string name() const { return fmt::format("{}_sw{}", shape.name(), window); }
};

// Tokens no query sees hold NaN, and the table entries of blocks wholly before the first
// query's window are -1: a kernel that reads either fails.
struct PoisonedFixture {
  PagedAttentionFixture f;
  std::vector<int32_t> table;  // f.block_table with the unread blocks released

  explicit PoisonedFixture(const SlidingCase& c, uint32_t seed) : f(PagedAttentionFixture::make(c.shape, seed)) {
    f.sliding_window = c.window;
    const int first_seen = std::max(0, c.shape.num_context_tokens - c.shape.num_queries - c.window + 1);
    const std::vector<float> nan(f.storage->layout().values_per_token(), std::numeric_limits<float>::quiet_NaN());
    for (int t = 0; t < first_seen; ++t) {
      const BlockId block(f.block_table[static_cast<size_t>(t / c.shape.block_size)]);
      f.storage->write_token(PagedAttentionFixture::kLayer, block, t % c.shape.block_size, nan.data(), nan.data());
    }
    f.reread_stored();
    table = f.block_table;
    for (int b = 0; b < first_seen / c.shape.block_size; ++b) table[static_cast<size_t>(b)] = -1;
  }

  std::vector<float> run(ThreadPool& pool, AttentionIsa isa) const {
    std::vector<float> out(f.q.size(), std::numeric_limits<float>::quiet_NaN());
    PagedAttentionArgs args = f.paged_args(out.data());
    args.block_table = table.data();
    const AttentionIsa resolved = resolve_attention_isa(isa, f.shape.head_dim);
    const auto family = resolved == AttentionIsa::kAvx512 ? attention_internal::KernelFamily::kAvx512
                        : resolved == AttentionIsa::kAvx2 ? attention_internal::KernelFamily::kAvx2
                                                          : attention_internal::KernelFamily::kPortable;
    const uint64_t before = attention_internal::kernel_family_runs(family);
    paged_attention(args, pool, isa);
    EXPECT_GT(attention_internal::kernel_family_runs(family), before)
        << attention_isa_name(resolved) << " resolved but its kernels did not run";
    return out;
  }
};

std::vector<SlidingCase> sliding_cases() {
  std::vector<SlidingCase> cases;
  // 100 context tokens. Windows: 1 (only itself), 7 (inside a block), 16 (one block), 37
  // (mid-block edge), 95 (the prefill's first queries see token 0, later ones do not), and
  // 200 (larger than the context: plain causal).
  for (KvType t : {KvType::kF32, KvType::kF16, KvType::kInt8, KvType::kInt4, KvType::kKivi4}) {
    for (auto [h, kvh] : {std::pair{4, 4}, std::pair{8, 2}}) {
      for (auto [d, bs] : {std::pair{64, 16}, std::pair{64, 1}, std::pair{8, 16}}) {
        for (int nq : {1, 5, 40}) {
          for (int w : {1, 7, 16, 37, 95, 200}) {
            if ((d != 64 || bs != 16) && w != 7 && w != 37) continue;  // all windows for the common shape
            cases.push_back({{h, kvh, d, bs, 100, nq, t, t}, w});
          }
        }
      }
    }
  }
  for (KvType t : {KvType::kBf16, KvType::kFp8, KvType::kKivi2}) cases.push_back({{8, 2, 64, 16, 100, 5, t, t}, 37});
  cases.push_back({{8, 2, 64, 16, 100, 3, KvType::kInt8, KvType::kInt4}, 37});
  cases.push_back({{8, 2, 64, 16, 100, 4, KvType::kKivi4, KvType::kKivi4, 32}, 40});  // staged + sealed KIVI
  // Long decode split into chunks (flash-decoding), with the window inside a chunk; many
  // query tiles of a prefill (each starting its own window).
  cases.push_back({{32, 8, 64, 16, 1100, 1, KvType::kF32, KvType::kF32}, 333});
  cases.push_back({{32, 8, 64, 16, 1100, 1, KvType::kInt8, KvType::kInt8}, 512});
  cases.push_back({{8, 1, 64, 16, 700, 300, KvType::kF16, KvType::kF16}, 128});
  cases.push_back({{8, 1, 64, 16, 700, 300, KvType::kInt4, KvType::kInt4}, 31});
  return cases;
}

class SlidingWindowAttention : public ::testing::TestWithParam<SlidingCase> {};

TEST_P(SlidingWindowAttention, MatchesReferenceForEveryIsaWithoutReadingOutsideTheWindow) {
  ThreadPool pool(2);
  const PoisonedFixture p(GetParam(), 1357);
  const std::vector<float> ref = p.f.run_reference_stored();
  const float scale = std::max(max_abs(ref), 1e-3f);
  for (AttentionIsa isa : {AttentionIsa::kPortable, AttentionIsa::kAvx2, AttentionIsa::kAvx512}) {
    const AttentionIsa resolved = resolve_attention_isa(isa, p.f.shape.head_dim);
    if (resolved != isa) {
      GTEST_LOG_(INFO) << attention_isa_name(isa) << " not available here (CPU or head_dim): skipped";
      continue;
    }
    EXPECT_LE(max_abs_diff(p.run(pool, isa), ref), kRelTol * scale) << attention_isa_name(isa);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, SlidingWindowAttention, ::testing::ValuesIn(sliding_cases()),
                         [](const auto& info) { return info.param.name(); });

// The window really cuts: the result differs from plain causal attention once a query's
// window excludes tokens (so the kernels do not merely ignore the field).
TEST(SlidingWindowAttentionEdges, DiffersFromCausalAttentionWhenTheWindowCuts) {
  ThreadPool pool(2);
  PagedAttentionFixture f = PagedAttentionFixture::make({8, 2, 64, 16, 100, 5, KvType::kF32, KvType::kF32}, 11);
  const std::vector<float> causal = f.run_paged(pool);
  f.sliding_window = 37;
  const std::vector<float> windowed = f.run_paged(pool);
  EXPECT_GT(max_abs_diff(windowed, causal), 1e-3f * std::max(max_abs(causal), 1e-3f));
}

}  // namespace
}  // namespace kvlm
