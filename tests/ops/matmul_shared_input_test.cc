// matmul_shared_input against matmul() on each matrix: one quantization of x and one pass of the
// pool over several matrices' rows must give every matrix's results bit for bit, on every ISA
// this CPU runs, for decode, row-kernel batches and the batch kernels (panels, token groups).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/quantize.h"
#include "ops/matmul.h"
#include "ops/matmul_kernels.h"

namespace kvlm {
namespace {

using ops_internal::Isa;

struct Matrix {
  GgmlType type;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> bytes;

  WeightMatrix view() const { return WeightMatrix{type, bytes.data(), rows, cols, ggml_row_bytes(type, cols)}; }
};

Matrix make_matrix(GgmlType type, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Matrix m{type, rows, cols, std::vector<uint8_t>(ggml_row_bytes(type, cols) * rows)};
  std::vector<float> src(cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : src) v = normal(rng);
    quantize_row_reference(type, src.data(), m.bytes.data() + r * ggml_row_bytes(type, cols), cols);
  }
  return m;
}

std::vector<float> make_input(int64_t num_tokens, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(num_tokens * cols);
  for (float& v : x) v = normal(rng);
  return x;
}

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
    const Matrix a = make_matrix(type, 37, cols, seed++);
    const Matrix b = make_matrix(type, 64, cols, seed++);
    const Matrix c = make_matrix(type, 13, cols, seed++);
    const WeightMatrix wa = a.view(), wb = b.view(), wc = c.view();
    // 1: decode; 5: row kernels; 16 and 37: the AVX2 panels and AVX-512 token groups with and
    // without a remainder; 130: AMX tiles and a remainder.
    std::vector<int64_t> token_counts = {1, 5, 16, 37};
    if (isa == Isa::kAmx) token_counts.push_back(130);
    for (int64_t num_tokens : token_counts) {
      SCOPED_TRACE(std::string(ggml_type_name(type)) + ", " + std::to_string(num_tokens) + " tokens");
      const std::vector<float> x = make_input(num_tokens, cols, seed++);
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
  const Matrix q = make_matrix(GgmlType::kQ4_K, 40, cols, 11);
  const Matrix k = make_matrix(GgmlType::kQ4_K, 24, cols, 12);
  const Matrix v = make_matrix(GgmlType::kQ5_K, 24, cols, 13);
  const Matrix o = make_matrix(GgmlType::kQ4_K, 8, cols, 14);
  const WeightMatrix wq = q.view(), wk = k.view(), wv = v.view(), wo = o.view();
  for (int64_t num_tokens : {1, 9}) {
    const std::vector<float> x = make_input(num_tokens, cols, 15);
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
  const Matrix a = make_matrix(GgmlType::kQ8_0, 4, 64, 21);
  const Matrix b = make_matrix(GgmlType::kQ8_0, 4, 96, 22);
  const WeightMatrix wa = a.view(), wb = b.view();
  std::vector<float> x(96, 1.0f), ya(4), yb(4);
  const MatmulOutput outs[] = {{&wa, ya.data()}, {&wb, yb.data()}};
  EXPECT_DEATH(ops_internal::matmul_shared_input_with_isa(Isa::kPortable, outs, x.data(), 1, pool),
               "differ in type or width");
}

}  // namespace
}  // namespace kvlm
