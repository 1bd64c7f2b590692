// matmul_shared_input against matmul() on each matrix: one quantization of x and one pass of the
// pool over several matrices' rows must give every matrix's results bit for bit, on every ISA
// this CPU runs, for decode, row-kernel batches and the batch kernels (panels, token groups).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ops/matmul.h"
#include "ops/matmul_kernels.h"
#include "ops/matmul_test_data.h"

namespace kvlm {
namespace {

using ops_internal::Isa;
using testing::make_activations;
using testing::make_weights;
using testing::TestWeights;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class MatmulSharedInput : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!ops_internal::isa_supported(GetParam())) {
      GTEST_SKIP() << ops_internal::isa_name(GetParam()) << " is not available on this CPU";
    }
  }
};

// Rows that end mid row group (37, 13) and a matrix of one row group, so chunks cross from
// one matrix into the next at odd places.
TEST_P(MatmulSharedInput, EachMatrixGetsWhatItsOwnMatmulGives) {
  const Isa isa = GetParam();
  ThreadPool pool(3);
  uint32_t seed = 1;
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_K,
                        GgmlType::kQ6_K, GgmlType::kIQ4_XS}) {
    const int64_t cols = 512;
    const TestWeights a = make_weights(type, 37, cols, seed++);
    const TestWeights b = make_weights(type, 64, cols, seed++);
    const TestWeights c = make_weights(type, 13, cols, seed++);
    const WeightMatrix wa = a.matrix(), wb = b.matrix(), wc = c.matrix();
    // 1: decode; 5: row kernels; 16 and 37: the AVX2 panels and AVX-512 token groups with and
    // without a remainder; 130: AMX tiles and a remainder.
    std::vector<int64_t> token_counts = {1, 5, 16, 37};
    if (isa == Isa::kAmx) token_counts.push_back(130);
    for (int64_t num_tokens : token_counts) {
      SCOPED_TRACE(std::string(ggml_type_name(type)) + ", " + std::to_string(num_tokens) + " tokens");
      const std::vector<float> x = make_activations(num_tokens, cols, seed++);
      std::vector<float> ya(num_tokens * a.rows), yb(num_tokens * b.rows), yc(num_tokens * c.rows);
      ops_internal::matmul_with_isa(isa, wa, x.data(), ya.data(), num_tokens, pool);
      ops_internal::matmul_with_isa(isa, wb, x.data(), yb.data(), num_tokens, pool);
      ops_internal::matmul_with_isa(isa, wc, x.data(), yc.data(), num_tokens, pool);

      std::vector<float> sa(ya.size(), -1.0f), sb(yb.size(), -1.0f), sc(yc.size(), -1.0f);
      const MatmulOutput outs[] = {{&wa, sa.data()}, {&wb, sb.data()}, {&wc, sc.data()}};
      const Isa witness = isa == Isa::kAmx && !((type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0) &&
                                                num_tokens >= ops_internal::kAmxMinTokens)
                              ? Isa::kAvx512
                              : isa;
      const uint64_t runs_before = ops_internal::isa_kernel_runs(witness);
      ops_internal::matmul_shared_input_with_isa(isa, outs, x.data(), num_tokens, pool);
      ASSERT_GT(ops_internal::isa_kernel_runs(witness), runs_before)
          << "no " << ops_internal::isa_name(witness) << " kernel ran";
      EXPECT_TRUE(same_bits(sa, ya)) << "first matrix";
      EXPECT_TRUE(same_bits(sb, yb)) << "second matrix";
      EXPECT_TRUE(same_bits(sc, yc)) << "third matrix";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, MatmulSharedInput,
                         ::testing::Values(Isa::kPortable, Isa::kAvx2, Isa::kAvx512, Isa::kAmx),
                         [](const auto& info) { return std::string(ops_internal::isa_name(info.param)); });

// The public entry takes matrices of different types and widths in any order (a Q4_K_S file's
// q/k/v mix Q4_K and Q5_K): runs of one type and width go together, and each matrix still gets
// matmul()'s results.
TEST(MatmulSharedInputMixed, RunsOfOneTypeGoTogether) {
  ThreadPool pool(2);
  const int64_t cols = 256;
  const TestWeights q = make_weights(GgmlType::kQ4_K, 40, cols, 11);
  const TestWeights k = make_weights(GgmlType::kQ4_K, 24, cols, 12);
  const TestWeights v = make_weights(GgmlType::kQ5_K, 24, cols, 13);
  const TestWeights o = make_weights(GgmlType::kQ4_K, 8, cols, 14);
  const WeightMatrix wq = q.matrix(), wk = k.matrix(), wv = v.matrix(), wo = o.matrix();
  for (int64_t num_tokens : {1, 9}) {
    const std::vector<float> x = make_activations(num_tokens, cols, 15);
    std::vector<std::vector<float>> each, shared;
    for (const WeightMatrix* w : {&wq, &wk, &wv, &wo}) {
      each.emplace_back(num_tokens * w->rows);
      matmul(*w, x.data(), each.back().data(), num_tokens, pool);
      shared.emplace_back(num_tokens * w->rows, -1.0f);
    }
    const MatmulOutput outs[] = {
        {&wq, shared[0].data()}, {&wk, shared[1].data()}, {&wv, shared[2].data()}, {&wo, shared[3].data()}};
    matmul_shared_input(outs, x.data(), num_tokens, pool);
    for (size_t i = 0; i < each.size(); ++i) EXPECT_TRUE(same_bits(shared[i], each[i])) << "matrix " << i;
  }
}

TEST(MatmulSharedInputDeathTest, MatricesOfDifferentWidthsCannotShareOnePass) {
  ThreadPool pool(1);
  const TestWeights a = make_weights(GgmlType::kQ8_0, 4, 64, 21);
  const TestWeights b = make_weights(GgmlType::kQ8_0, 4, 96, 22);
  const WeightMatrix wa = a.matrix(), wb = b.matrix();
  std::vector<float> x(96, 1.0f), ya(4), yb(4);
  const MatmulOutput outs[] = {{&wa, ya.data()}, {&wb, yb.data()}};
  EXPECT_DEATH(ops_internal::matmul_shared_input_with_isa(Isa::kPortable, outs, x.data(), 1, pool),
               "differ in type or width");
}

}  // namespace
}  // namespace kvlm
