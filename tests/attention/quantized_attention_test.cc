// Paged attention over quantized KV blocks (bf16, fp8, int8, int4, KIVI), decoded inside the kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "attention/paged_attention.h"
#include "attention_test_util.h"

namespace kvlm {
namespace {

using testing::AttentionShape;
using testing::max_abs;
using testing::max_abs_diff;
using testing::PagedAttentionFixture;

// The kernels decode the same codes with the same scales as decode_token, so
// against the double reference over the decoded (stored) K/V only f32 rounding
// differs: the same 1e-5 relative tolerance as the f32 cache. (A fused
// multiply-add in a loader can move a decoded value by one f32 ulp: far below it.)
constexpr float kRelTol = 1e-5f;

void expect_all_isas_match(const PagedAttentionFixture& f, ThreadPool& pool) {
  const std::vector<float> ref = f.run_reference_stored();
  const float scale = std::max(max_abs(ref), 1e-3f);
  for (AttentionIsa isa : {AttentionIsa::kPortable, AttentionIsa::kAvx2, AttentionIsa::kAvx512}) {
    const std::vector<float> out = f.run_paged(pool, isa);
    EXPECT_LE(max_abs_diff(out, ref), kRelTol * scale)
        << attention_isa_name(resolve_attention_isa(isa, f.shape.head_dim));
  }
}

constexpr KvType kQuantTypes[] = {KvType::kBf16, KvType::kFp8,   KvType::kInt8,
                                  KvType::kInt4, KvType::kKivi4, KvType::kKivi2};

std::vector<AttentionShape> quant_shapes() {
  std::vector<AttentionShape> shapes;
  for (KvType t : kQuantTypes) {
    for (auto [h, kvh] : {std::pair{4, 4}, std::pair{8, 2}, std::pair{8, 1}}) {  // MHA, GQA, MQA
      for (int d : {8, 64, 128}) {
        for (int bs : {1, 16, 64}) {
          shapes.push_back({h, kvh, d, bs, 100, 1, t, t});  // decode
          shapes.push_back({h, kvh, d, bs, 70, 5, t, t});   // prefill chunk
        }
      }
    }
    shapes.push_back({32, 8, 64, 16, 700, 1, t, t});  // llama-3.2-1b heads, split into chunks
  }
  // K and V in different codecs.
  const std::pair<KvType, KvType> mixed[] = {{KvType::kInt8, KvType::kInt4},  {KvType::kKivi4, KvType::kF16},
                                             {KvType::kF16, KvType::kKivi2},  {KvType::kInt4, KvType::kKivi4},
                                             {KvType::kFp8, KvType::kInt8},   {KvType::kKivi2, KvType::kBf16}};
  for (auto [k, v] : mixed) {
    shapes.push_back({8, 2, 64, 16, 100, 3, k, v});
    shapes.push_back({4, 1, 8, 16, 50, 1, k, v});
  }
  // Integer q·k (int8, int4 keys) where the SIMD kernels take a partial last chunk or score a
  // row in segments: head_dim 24 (avx2: 12 code bytes), 48 (avx512: a masked chunk), 256
  // (avx2: more int4 groups than a register of pairs holds), 512 (avx512 likewise).
  for (KvType t : {KvType::kInt8, KvType::kInt4}) {
    for (int d : {24, 48, 256, 512}) {
      shapes.push_back({8, 2, d, 16, 40, 1, t, t});
      shapes.push_back({4, 4, d, 1, 20, 3, t, t});
    }
  }
  // KIVI residual windows: staged and sealed blocks in one context.
  for (KvType t : {KvType::kKivi4, KvType::kKivi2}) {
    shapes.push_back({8, 2, 64, 16, 100, 1, t, t, 32});
    shapes.push_back({8, 2, 8, 16, 100, 4, t, t, 20});
    shapes.push_back({4, 4, 64, 1, 40, 1, t, t, 7});
  }
  return shapes;
}

class QuantizedAttention : public ::testing::TestWithParam<AttentionShape> {};

TEST_P(QuantizedAttention, MatchesReferenceOnDecodedBlocksForEveryIsa) {
  ThreadPool pool(2);
  const PagedAttentionFixture f = PagedAttentionFixture::make(GetParam(), 4321);
  expect_all_isas_match(f, pool);
}

INSTANTIATE_TEST_SUITE_P(Shapes, QuantizedAttention, ::testing::ValuesIn(quant_shapes()),
                         [](const auto& info) { return info.param.name(); });

// Against the unquantized K/V the error shrinks with more bits: a sanity check
// that the kernels read the codes, not just that they agree with decode_token.
TEST(QuantizedAttention, ErrorAgainstOriginalShrinksWithBits) {
  ThreadPool pool(2);
  auto err = [&](KvType t) {
    const PagedAttentionFixture f = PagedAttentionFixture::make({8, 2, 64, 16, 200, 1, t, t}, 8, 2.0f);
    return max_abs_diff(f.run_paged(pool), f.run_reference_original()) / max_abs(f.run_reference_original());
  };
  const float e_bf16 = err(KvType::kBf16), e_int8 = err(KvType::kInt8), e_fp8 = err(KvType::kFp8);
  const float e_int4 = err(KvType::kInt4), e_kivi2 = err(KvType::kKivi2);
  EXPECT_GT(e_int8, 0.0f);
  EXPECT_LT(e_int8, 0.02f);
  EXPECT_LT(e_bf16, 0.02f);
  EXPECT_LT(e_int8, e_int4);
  EXPECT_LT(e_fp8, e_int4);
  EXPECT_LT(e_int4, e_kivi2);
  EXPECT_LT(e_int4, 0.2f);
}

// Over int8 and int4 keys the kernels score with rounded queries (query_rounding.h); the
// tests above compare them with a reference that rounds the same way. Against exact queries
// the rounding moves each score by at most δ = step/2 × Σ_d |k_d| (step = max|q·scale| /
// 16383), so each softmax weight by a factor within e^{±2δ} and each output value by at most
// (e^{2δ} − 1) × max|v| over the row's tokens: the bound asserted here, per (query, head).
TEST(QuantizedAttention, RoundedQueriesStayWithinTheirBoundOfExactQueries) {
  ThreadPool pool(2);
  for (KvType t : {KvType::kInt8, KvType::kInt4}) {
    for (int d : {8, 64, 128}) {
      const AttentionShape shape{8, 2, d, 16, 120, 3, t, t};
      const PagedAttentionFixture f = PagedAttentionFixture::make(shape, 99);
      const std::vector<float> exact = f.run_reference_stored_exact_queries();
      const std::vector<float> rounded = f.run_reference_stored();
      const float out_scale = std::max(max_abs(exact), 1e-3f);
      EXPECT_GT(max_abs_diff(rounded, exact), 0.0f) << "the rounding must be visible to this test";
      const size_t D = static_cast<size_t>(d);
      const int group = shape.num_heads / shape.num_kv_heads;
      for (AttentionIsa isa : {AttentionIsa::kPortable, AttentionIsa::kAvx2, AttentionIsa::kAvx512}) {
        const std::vector<float> out = f.run_paged(pool, isa);
        double worst_delta = 0.0;
        for (int i = 0; i < shape.num_queries; ++i) {
          const int pos = shape.num_context_tokens - shape.num_queries + i;
          for (int h = 0; h < shape.num_heads; ++h) {
            const size_t row = static_cast<size_t>(i) * shape.num_heads + h;
            const size_t kvh = static_cast<size_t>(h / group);
            double q_max = 0.0;
            for (size_t e = 0; e < D; ++e) q_max = std::max(q_max, std::abs(double{f.q[row * D + e] * f.scale}));
            const double step = q_max / 16383.0;
            double delta = 0.0, v_max = 0.0;
            for (int tok = 0; tok <= pos; ++tok) {
              const size_t base = (static_cast<size_t>(tok) * shape.num_kv_heads + kvh) * D;
              double k_l1 = 0.0;
              for (size_t e = 0; e < D; ++e) {
                k_l1 += std::abs(double{f.k_stored[base + e]});
                v_max = std::max(v_max, std::abs(double{f.v_stored[base + e]}));
              }
              delta = std::max(delta, step / 2 * k_l1);
            }
            worst_delta = std::max(worst_delta, delta);
            const double bound = std::expm1(2 * delta) * v_max + 1e-5 * out_scale;
            for (size_t e = 0; e < D; ++e) {
              ASSERT_LE(std::abs(double{out[row * D + e]} - exact[row * D + e]), bound)
                  << kv_type_name(t) << " d" << d << " " << attention_isa_name(resolve_attention_isa(isa, d)) << " row "
                  << row;
            }
          }
        }
        // The bound itself is small: the rounding is far finer than the codecs' own error.
        EXPECT_LT(worst_delta, 5e-3) << kv_type_name(t) << " d" << d;
      }
    }
  }
}

// Generation one token at a time, sealing after each write as the model does:
// blocks move from staged to sealed while decode runs (rewriting the fixture's
// blocks, which first re-stages them), and every step matches the reference over
// what the storage holds at that step.
TEST(QuantizedAttention, KiviDecodeAcrossSealing) {
  ThreadPool pool(2);
  for (int residual : {0, 16}) {
    AttentionShape s{8, 2, 16, 4, 30, 1, KvType::kKivi4, KvType::kKivi4, residual};
    PagedAttentionFixture f = PagedAttentionFixture::make(s, 17);
    const size_t width = static_cast<size_t>(s.num_kv_heads) * s.head_dim;
    const std::vector<float> k = f.k, v = f.v;
    for (int n = 1; n <= 30; ++n) {
      const int t = n - 1;
      const BlockId block(f.block_table[static_cast<size_t>(t / s.block_size)]);
      f.storage->write_token(PagedAttentionFixture::kLayer, block, t % s.block_size, k.data() + t * width,
                             v.data() + t * width);
      f.storage->seal_full_blocks(PagedAttentionFixture::kLayer, f.block_table.data(), n);
      if (n % 3 != 0 && n != 30) continue;
      // The fixture's storage and table with a context of n tokens (one query: q keeps its size).
      f.shape.num_context_tokens = n;
      f.k_stored.resize(n * width);
      f.v_stored.resize(n * width);
      f.reread_stored();
      SCOPED_TRACE(::testing::Message() << "residual " << residual << " tokens " << n);
      expect_all_isas_match(f, pool);
    }
    // With a 16-token window, the 4 most recent full blocks and the tail are still exact.
    for (int t = 12; t < 30 && residual == 16; ++t) {
      for (size_t i = 0; i < width; ++i) ASSERT_EQ(f.k_stored[t * width + i], k[t * width + i]) << t;
    }
  }
}

}  // namespace
}  // namespace kvlm
