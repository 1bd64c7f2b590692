// matmul on every weight type and every ISA this CPU runs, against a double-precision
// reference over the dequantized weights.
#include "ops/matmul.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "core/quantize.h"
#include "ops/matmul_kernels.h"
#include "ops/matmul_test_data.h"

namespace kvlm {
namespace {

using ops_internal::Isa;
using testing::make_activations;
using testing::make_weights;
using testing::TestWeights;

constexpr double kF32Ulp = 1.0 / (1 << 24);  // unit roundoff of f32

// Raw random blocks, covering bytes a quantizer would never write (Q8_0 -128, every nibble).
TestWeights make_raw_blocks(GgmlType type, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  TestWeights w{type, rows, cols, {}, {}};
  const uint64_t row_bytes = ggml_row_bytes(type, cols);
  const uint64_t block_bytes = ggml_type_traits(type).block_bytes;
  w.bytes.resize(row_bytes * rows);
  w.dequant.resize(rows * cols);
  // Where each type keeps its f16 super-scales (kept finite); every other byte is random.
  std::vector<uint64_t> scale_offsets = {0};
  switch (type) {
    case GgmlType::kQ4_1: case GgmlType::kQ5_1: case GgmlType::kQ4_K: case GgmlType::kQ5_K: scale_offsets = {0, 2}; break;
    case GgmlType::kQ2_K: scale_offsets = {80, 82}; break;
    case GgmlType::kQ3_K: scale_offsets = {108}; break;
    case GgmlType::kQ6_K: scale_offsets = {208}; break;
    default: break;
  }
  for (uint64_t off = 0; off < w.bytes.size(); off += block_bytes) {
    for (uint64_t i = 0; i < block_bytes; ++i) w.bytes[off + i] = static_cast<uint8_t>(byte(rng));
    for (uint64_t so : scale_offsets) {
      const uint16_t d = fp32_to_fp16(scale(rng));
      std::memcpy(&w.bytes[off + so], &d, 2);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row_reference(type, w.bytes.data() + r * row_bytes, w.dequant.data() + r * cols, cols);
  }
  return w;
}

// f32 → bf16 → f32, rounding to nearest even (finite inputs).
float round_to_bf16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits = (bits + 0x7fff + ((bits >> 16) & 1)) & 0xffff0000u;
  std::memcpy(&v, &bits, 4);
  return v;
}

bool is_quantized(GgmlType type) {
  return ops_internal::activation_format(type) != ops_internal::ActivationFormat::kNone;
}
bool is_super_block(GgmlType type) {
  return ops_internal::activation_format(type) == ops_internal::ActivationFormat::kSuperBlocks;
}

const std::vector<GgmlType>& all_types() {
  static const std::vector<GgmlType> types = {
      GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16,   GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1,
      GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kIQ4_NL, GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K,
      GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kIQ4_XS};
  return types;
}

// The kernels a call on `isa` must run: AMX has tile kernels for batches of kAmxMinTokens or
// more Q8_0 / Q4_0 tokens and runs the AVX-512 kernels for everything else.
bool amx_tiles_expected(GgmlType type, int64_t num_tokens) {
  return (type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0) && num_tokens >= ops_internal::kAmxMinTokens;
}

// The types the AVX2 panel kernel computes for batches (matmul_panels_avx2.cc).
bool avx2_panel_type(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
    case GgmlType::kIQ4_XS:
      return true;
    default:
      return false;
  }
}

// Whether a batch of a super-block type takes the AVX-512 group kernel (matmul_super_groups_avx512.cc),
// which groups every token of the batch.
bool super_groups_expected(GgmlType type, Isa isa, int64_t num_tokens) {
  return (isa == Isa::kAvx512 || isa == Isa::kAmx) && is_super_block(type) &&
         num_tokens >= ops_internal::avx512_super_group_min_tokens();
}

// The activation block a call quantizes with: 256 for the super-block types' row kernels and
// the AVX2 K-quant panels (integer sub-block scales), 32 for everything else (the other AVX2
// panels and the AVX-512 super-block group kernel take 32-element blocks for every type).
int64_t activation_block(GgmlType type, Isa isa, int64_t num_tokens) {
  if (isa == Isa::kAvx2 && avx2_panel_type(type) && num_tokens >= ops_internal::avx2_panel_min_tokens(type)) {
    return ops_internal::avx2_super_panels_support(type) ? 256 : 32;
  }
  if (super_groups_expected(type, isa, num_tokens)) return 32;
  return is_super_block(type) ? 256 : 32;
}

// Calls matmul_with_isa and asserts that a kernel of that ISA ran (no silent fallback).
void matmul_on(Isa isa, const WeightMatrix& w, const float* x, float* y, int64_t num_tokens, ThreadPool& pool) {
  const Isa witness = isa == Isa::kAmx && !amx_tiles_expected(w.type, num_tokens) ? Isa::kAvx512 : isa;
  const uint64_t before = ops_internal::isa_kernel_runs(witness);
  const uint64_t panels_before = ops_internal::avx2_panel_kernel_runs();
  const uint64_t super_groups_before = ops_internal::avx512_super_group_kernel_runs();
  ops_internal::matmul_with_isa(isa, w, x, y, num_tokens, pool);
  ASSERT_GT(ops_internal::isa_kernel_runs(witness), before) << "no " << ops_internal::isa_name(witness) << " kernel ran";
  // AVX2 batches of these types must take the panel kernel, and nothing else may.
  const bool panels = isa == Isa::kAvx2 && avx2_panel_type(w.type) &&
                      num_tokens >= ops_internal::avx2_panel_min_tokens(w.type);
  if (panels) {
    ASSERT_GT(ops_internal::avx2_panel_kernel_runs(), panels_before) << "the AVX2 panel kernel did not run";
  } else {
    ASSERT_EQ(ops_internal::avx2_panel_kernel_runs(), panels_before) << "the AVX2 panel kernel ran";
  }
  // AVX-512 (and AMX) batches of the super-block types must take their group kernel, and
  // nothing else may.
  if (super_groups_expected(w.type, isa, num_tokens)) {
    ASSERT_GT(ops_internal::avx512_super_group_kernel_runs(), super_groups_before)
        << "the AVX-512 super-block group kernel did not run";
  } else {
    ASSERT_EQ(ops_internal::avx512_super_group_kernel_runs(), super_groups_before)
        << "the AVX-512 super-block group kernel ran";
  }
}

// What x becomes after the activation quantization (identical on every ISA; tested below).
std::vector<float> dequantized_activations(const std::vector<float>& x, int64_t num_tokens, int64_t cols,
                                           int64_t block, std::vector<float>* block_scales) {
  const int64_t num_blocks = cols / block;
  ops_internal::ActivationBuffer buffer;
  std::vector<float> out(x.size());
  block_scales->resize(num_tokens * num_blocks);
  const int8_t* qs = nullptr;
  const float* scales = nullptr;
  if (block == 256) {
    const ops_internal::SuperBlockActivations q = buffer.super_view(num_tokens, num_blocks);
    ops_internal::quantize_superblock_activations(x.data(), cols, 0, num_tokens, q);
    qs = q.qs;
    scales = q.scales;
  } else {
    const ops_internal::QuantizedActivations q = buffer.view(num_tokens, num_blocks);
    ops_internal::quantize_activations_portable(x.data(), cols, 0, num_tokens, 0, q);
    qs = q.qs;
    scales = q.scales;
  }
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const float d = scales[t * num_blocks + b];
      (*block_scales)[t * num_blocks + b] = d;
      for (int64_t i = 0; i < block; ++i) {
        const int64_t c = b * block + i;
        out[t * cols + c] = d * qs[t * cols + c];
      }
    }
  }
  return out;
}

// Checks y against Σ_c W[r][c]·x[t][c] in double. Every kernel may round its f32 sum in any
// order: |error| ≤ (cols + 16)·u·Σ|W·x| bounds that (u = 2^-24; each of the cols terms is
// rounded into at most cols additions, plus a few roundings for scales).
// For quantized types the operand x is the activation after quantization, and a second
// bound covers the distance to the unquantized x: |x - d·q| ≤ (d/2)(1 + 1e-4) per element
// (the 1e-4 covers f32 rounding of x/d), so
// |y - Σ W·x| ≤ Σ_blocks (d_block/2)(1 + 1e-4)·Σ_{c in block}|W[r][c]| on top of the rounding bound.
//
// Tokens the AMX kernel computes (the groups of token_groups_for_batch) multiply bf16 operands:
// each activation rounded to nearest even with 8 significant bits (relative error ≤ 2^-8), each
// weight as head + tail, two such roundings (≤ 2^-16), so the operand bound is
// |y - Σ W·x| ≤ (2^-8 + 2^-16 + 2^-24)·Σ|W·x| instead, on top of the rounding bound over the
// rounded operands (2·cols terms: heads and tails are separate products).
void expect_matches_bf16_reference(const TestWeights& w, const std::vector<float>& x, const std::vector<float>& y,
                                   int64_t t) {
  for (int64_t r = 0; r < w.rows; ++r) {
    const float* wr = &w.dequant[r * w.cols];
    const float* xt = &x[t * w.cols];
    double exact = 0.0, magnitude = 0.0, exact_unrounded = 0.0, magnitude_unrounded = 0.0;
    for (int64_t c = 0; c < w.cols; ++c) {
      const float head = round_to_bf16(wr[c]);
      const float tail = round_to_bf16(wr[c] - head);
      const double xr = round_to_bf16(xt[c]);
      exact += static_cast<double>(head) * xr + static_cast<double>(tail) * xr;
      magnitude += std::fabs(static_cast<double>(head) * xr) + std::fabs(static_cast<double>(tail) * xr);
      exact_unrounded += static_cast<double>(wr[c]) * xt[c];
      magnitude_unrounded += std::fabs(static_cast<double>(wr[c]) * xt[c]);
    }
    const double rounding_bound = (2 * w.cols + 16) * kF32Ulp * magnitude + 1e-30;
    const double got = y[t * w.rows + r];
    ASSERT_NEAR(got, exact, rounding_bound) << "bf16 token " << t << " row " << r;
    const double operand_bound = (1.0 / 256 + 1.0 / (1 << 16) + 1.0 / (1 << 24)) * magnitude_unrounded;
    ASSERT_NEAR(got, exact_unrounded, operand_bound + rounding_bound) << "bf16 token " << t << " row " << r;
  }
}

void expect_matches_reference(const TestWeights& w, const std::vector<float>& x, const std::vector<float>& y,
                              int64_t num_tokens, Isa isa) {
  const int64_t bf16_tokens =
      ops_internal::amx_takes_batch(isa, w.type, num_tokens)
          ? std::min(num_tokens, ops_internal::token_groups_for_batch(isa, w.type, num_tokens) *
                                     ops_internal::Bf16TokenGroups::kTokens)
          : 0;
  for (int64_t t = 0; t < bf16_tokens; ++t) {
    expect_matches_bf16_reference(w, x, y, t);
    if (::testing::Test::HasFatalFailure()) return;
  }
  std::vector<float> block_scales;
  const int64_t act_block = activation_block(w.type, isa, num_tokens);
  const std::vector<float> xq =
      is_quantized(w.type) ? dequantized_activations(x, num_tokens, w.cols, act_block, &block_scales) : x;
  for (int64_t t = bf16_tokens; t < num_tokens; ++t) {
    for (int64_t r = 0; r < w.rows; ++r) {
      const float* wr = &w.dequant[r * w.cols];
      const float* xt = &xq[t * w.cols];
      double exact = 0.0;
      double magnitude = 0.0;
      for (int64_t c = 0; c < w.cols; ++c) {
        exact += static_cast<double>(wr[c]) * xt[c];
        magnitude += std::fabs(static_cast<double>(wr[c]) * xt[c]);
      }
      const double rounding_bound = (w.cols + 16) * kF32Ulp * magnitude + 1e-30;
      const double got = y[t * w.rows + r];
      ASSERT_NEAR(got, exact, rounding_bound) << "token " << t << " row " << r;
      if (!is_quantized(w.type)) continue;
      double exact_unquantized = 0.0;
      double quantization_bound = 0.0;
      for (int64_t c = 0; c < w.cols; ++c) {
        exact_unquantized += static_cast<double>(wr[c]) * x[t * w.cols + c];
        quantization_bound += 0.5 * block_scales[t * (w.cols / act_block) + c / act_block] * (1.0 + 1e-4) * std::fabs(wr[c]);
      }
      ASSERT_NEAR(got, exact_unquantized, quantization_bound + rounding_bound) << "token " << t << " row " << r;
    }
  }
}

std::string type_isa_name(GgmlType type, Isa isa) {
  return fmt::format("{}_{}", ggml_type_name(type), ops_internal::isa_name(isa));
}

struct TypeIsa {
  GgmlType type;
  Isa isa;
};

void PrintTo(const TypeIsa& p, std::ostream* os) { *os << type_isa_name(p.type, p.isa); }

std::vector<TypeIsa> all_type_isas() {
  std::vector<TypeIsa> out;
  for (GgmlType type : all_types()) {
    for (Isa isa : {Isa::kPortable, Isa::kAvx2, Isa::kAvx512}) out.push_back({type, isa});
    // AMX machines: Q8_0 / Q4_0 batches take the tiles, the super-block types the AVX-512 group
    // kernel (under Isa::kAmx, as the default ISA there).
    if (type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0 || is_super_block(type)) out.push_back({type, Isa::kAmx});
  }
  return out;
}

// Every ISA is instantiated; one this CPU (or KVLM_CPU) lacks is a reported skip.
class MatmulTest : public ::testing::TestWithParam<TypeIsa> {
 protected:
  void SetUp() override {
    if (!ops_internal::isa_supported(GetParam().isa)) {
      GTEST_SKIP() << ops_internal::isa_name(GetParam().isa) << " is not available on this CPU";
    }
  }
};

TEST_P(MatmulTest, MatchesReferenceOnOddShapes) {
  const auto [type, isa] = GetParam();
  ThreadPool pool(2);
  std::vector<int64_t> col_counts = {32, 96, 256};                             // 1, 3 and 8 blocks of 32
  if (is_super_block(type)) col_counts = {256, 768};                           // 1 and 3 super-blocks
  if (!is_quantized(type)) col_counts.insert(col_counts.end(), {8, 40, 172});  // 172: stories260K FFN
  uint32_t seed = 1;
  for (int64_t rows : {1, 7, 33}) {
    for (int64_t cols : col_counts) {
      const TestWeights w = make_weights(type, rows, cols, seed++);
      const int64_t amx_batch = ops_internal::kAmxMinTokens + 9;  // AMX groups and a padded one
      for (int64_t num_tokens : {int64_t{1}, int64_t{3}, int64_t{8}, int64_t{17}, amx_batch}) {
        SCOPED_TRACE(fmt::format("rows {} cols {} tokens {}", rows, cols, num_tokens));
        const std::vector<float> x = make_activations(num_tokens, cols, seed++);
        std::vector<float> y(num_tokens * rows, NAN);
        matmul_on(isa, w.matrix(), x.data(), y.data(), num_tokens, pool);
        expect_matches_reference(w, x, y, num_tokens, isa);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Enough tokens and columns that activations are split into several token chunks and rows
// over several threads.
TEST_P(MatmulTest, MatchesReferenceOnLargeBatch) {
  const auto [type, isa] = GetParam();
  ThreadPool pool(3);
  const TestWeights w = make_weights(type, 67, 4096, 7);
  const int64_t num_tokens = 41;
  const std::vector<float> x = make_activations(num_tokens, w.cols, 8);
  std::vector<float> y(num_tokens * w.rows, NAN);
  matmul_on(isa, w.matrix(), x.data(), y.data(), num_tokens, pool);
  expect_matches_reference(w, x, y, num_tokens, isa);
}

// Each output element is computed by one thread in an order fixed by (type, cols, ISA,
// kernel): the thread count must not change a single bit.
TEST_P(MatmulTest, DeterministicAcrossThreadCounts) {
  const auto [type, isa] = GetParam();
  const TestWeights w = make_weights(type, 131, 512, 21);
  const int64_t num_tokens = 37;
  const std::vector<float> x = make_activations(num_tokens, w.cols, 22);
  std::vector<float> y1(num_tokens * w.rows), y3(num_tokens * w.rows);
  ThreadPool pool1(1);
  ThreadPool pool3(3);
  matmul_on(isa, w.matrix(), x.data(), y1.data(), num_tokens, pool1);
  matmul_on(isa, w.matrix(), x.data(), y3.data(), num_tokens, pool3);
  ASSERT_EQ(std::memcmp(y1.data(), y3.data(), y1.size() * sizeof(float)), 0);
}

// A token's outputs depend only on its own activations and on which kernel it falls to:
// tokens in groups of 16 take the token-group kernel where the ISA has one for the type (on
// AMX, the tile kernel for batches of kAmxMinTokens or more, else the AVX-512 one); every
// other token matches a single-token call bit for bit.
TEST_P(MatmulTest, TokenResultsIndependentOfBatchNeighbours) {
  const auto [type, isa] = GetParam();
  constexpr int64_t kGroup = ops_internal::TokenGroupActivations::kTokens;
  const TestWeights w = make_weights(type, 37, 256, 23);
  const int64_t num_tokens = kGroup + 3;
  const std::vector<float> x = make_activations(num_tokens, w.cols, 24);
  ThreadPool pool(2);
  std::vector<float> y(num_tokens * w.rows);
  matmul_on(isa, w.matrix(), x.data(), y.data(), num_tokens, pool);
  const int64_t num_groups = ops_internal::token_groups_for_batch(isa, type, num_tokens);
  if (super_groups_expected(type, isa, num_tokens)) {
    ASSERT_EQ(num_groups, 2);  // every token in a group, the second padded
  } else {
    ASSERT_LE(num_groups, 1);
  }
  // AVX2 batches take the panel kernel: each token is compared with itself in another batch
  // (first, beside three other tokens) instead of alone.
  const bool panels = ops_internal::avx2_panels_take_batch(isa, type, num_tokens);
  for (int64_t t = num_groups * kGroup; t < num_tokens; ++t) {
    const int64_t others = panels ? ops_internal::avx2_panel_min_tokens(type) - 1 : 0;
    std::vector<float> batch((1 + others) * w.cols);
    std::memcpy(batch.data(), &x[t * w.cols], w.cols * sizeof(float));
    for (int64_t i = 0; i < others; ++i) {
      std::memcpy(&batch[(1 + i) * w.cols], &x[((t + 5 + i) % num_tokens) * w.cols], w.cols * sizeof(float));
    }
    std::vector<float> single((1 + others) * w.rows);
    matmul_on(isa, w.matrix(), batch.data(), single.data(), 1 + others, pool);
    ASSERT_EQ(std::memcmp(single.data(), &y[t * w.rows], w.rows * sizeof(float)), 0) << "token " << t;
  }
  // The first 16 tokens again, in reverse order and followed by a second copy: other
  // neighbours, other lanes, same bits.
  std::vector<float> x2(2 * kGroup * w.cols);
  for (int64_t t = 0; t < kGroup; ++t) {
    std::memcpy(&x2[t * w.cols], &x[(kGroup - 1 - t) * w.cols], w.cols * sizeof(float));
    std::memcpy(&x2[(kGroup + t) * w.cols], &x[t * w.cols], w.cols * sizeof(float));
  }
  std::vector<float> y2(2 * kGroup * w.rows);
  matmul_on(isa, w.matrix(), x2.data(), y2.data(), 2 * kGroup, pool);
  // Against the 19-token call only where both calls take the same group kernel.
  const bool same_kernel = ops_internal::amx_takes_batch(isa, type, 2 * kGroup) ==
                               ops_internal::amx_takes_batch(isa, type, num_tokens) &&
                           ops_internal::avx2_panels_take_batch(isa, type, 2 * kGroup) == panels;
  for (int64_t t = 0; t < kGroup; ++t) {
    ASSERT_EQ(std::memcmp(&y2[(kGroup - 1 - t) * w.rows], &y2[(kGroup + t) * w.rows], w.rows * sizeof(float)), 0) << t;
    if (same_kernel) {
      ASSERT_EQ(std::memcmp(&y2[(kGroup + t) * w.rows], &y[t * w.rows], w.rows * sizeof(float)), 0) << t;
    }
  }
  // 16 + 12 tokens: the last 12 fill a padded group where the ISA groups tokens.
  const int64_t num_tokens3 = kGroup + 12;
  std::vector<float> x3(num_tokens3 * w.cols);
  std::memcpy(x3.data(), x.data(), kGroup * w.cols * sizeof(float));
  std::memcpy(&x3[kGroup * w.cols], x.data(), 12 * w.cols * sizeof(float));
  std::vector<float> y3(num_tokens3 * w.rows, NAN);
  matmul_on(isa, w.matrix(), x3.data(), y3.data(), num_tokens3, pool);
  for (int64_t t = 0; t < 12; ++t) {
    ASSERT_EQ(std::memcmp(&y3[(kGroup + t) * w.rows], &y[t * w.rows], w.rows * sizeof(float)), 0) << t;
  }
}

// The batch kernels' shape tests: random activations of num_tokens tokens against the
// reference on 1 thread, then bit for bit the same on 3 (whose row split differs).
void expect_reference_on_one_and_three_threads(Isa isa, const TestWeights& w, int64_t num_tokens, uint32_t seed) {
  ThreadPool pool1(1);
  ThreadPool pool3(3);
  const std::vector<float> x = make_activations(num_tokens, w.cols, seed);
  std::vector<float> y1(num_tokens * w.rows, NAN), y3(num_tokens * w.rows, NAN);
  matmul_on(isa, w.matrix(), x.data(), y1.data(), num_tokens, pool1);
  expect_matches_reference(w, x, y1, num_tokens, isa);
  matmul_on(isa, w.matrix(), x.data(), y3.data(), num_tokens, pool3);
  ASSERT_EQ(std::memcmp(y1.data(), y3.data(), y1.size() * sizeof(float)), 0);
}

// The AMX kernel stages weights in row blocks (96 rows at 4096 columns) and fetches the next
// block while computing one: many blocks, a ragged last one, a partial last group and tokens
// left to the row kernel, on 1 and 3 threads.
TEST(MatmulAmx, ManyRowBlocksOddRowsAndTokens) {
  if (!ops_internal::isa_supported(Isa::kAmx)) GTEST_SKIP() << "amx is not available on this CPU";
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0}) {
    const TestWeights w = make_weights(type, 333, 4096, 91);
    // Whole groups and 5 tokens for the row kernel; whole groups and a padded one of 11.
    for (int64_t num_tokens : {ops_internal::kAmxMinTokens + 5, ops_internal::kAmxMinTokens + 11}) {
      SCOPED_TRACE(fmt::format("{} tokens {}", ggml_type_name(type), num_tokens));
      expect_reference_on_one_and_three_threads(Isa::kAmx, w, num_tokens, 92);
    }
  }
}

// The AVX-512 token-group kernels run 12-row tiles over groups of 16 tokens, reading Q8_0
// weights in place and Q4_0 and the super-block types staged per tile: whole tiles, a last tile
// of every height below 12 (333 rows on 1 thread end in 9; 3 threads split at other multiples
// of 4), one group, and three groups plus a padded one, on 1 and 3 threads (whose row splits
// must not change a bit).
TEST(MatmulAvx512Groups, ManyTilesOddRowsAndTokens) {
  if (!ops_internal::isa_supported(Isa::kAvx512)) GTEST_SKIP() << "avx512 is not available on this CPU";
  for (GgmlType type : all_types()) {
    if (type != GgmlType::kQ8_0 && type != GgmlType::kQ4_0 && !is_super_block(type)) continue;
#ifdef KVLM_SANITIZED_BUILD
    // Sanitized builds (tests only, 5x slower) keep one super-block type per kernel shape: one
    // scale per 32-element block (Q4_K) and two (Q6_K). Release runs all six.
    if (is_super_block(type) && type != GgmlType::kQ4_K && type != GgmlType::kQ6_K) continue;
#endif
    const TestWeights w = make_weights(type, 333, 4096, 71);
    for (int64_t num_tokens : {int64_t{16}, int64_t{59}}) {
      SCOPED_TRACE(fmt::format("{} tokens {}", ggml_type_name(type), num_tokens));
      ASSERT_EQ(ops_internal::token_groups_for_batch(Isa::kAvx512, type, num_tokens), (num_tokens + 15) / 16);
      expect_reference_on_one_and_three_threads(Isa::kAvx512, w, num_tokens, 72);
    }
  }
}

// The AVX2 panel kernel stages 8-row panels in L2-sized blocks (two to five panels at 4096
// columns) and runs token chunks over them: many blocks, a ragged last panel, chunks and 4-, 3-,
// 2- and 1-token tiles, on 1 and 3 threads (whose row splits must not change a bit).
TEST(MatmulAvx2Panels, ManyRowBlocksOddRowsAndTokens) {
  if (!ops_internal::isa_supported(Isa::kAvx2)) GTEST_SKIP() << "avx2 is not available on this CPU";
  uint32_t seed = 51;
  for (GgmlType type : all_types()) {
    if (!avx2_panel_type(type)) continue;
    const TestWeights w = make_weights(type, 333, 4096, seed++);
    const int64_t min_tokens = ops_internal::avx2_panel_min_tokens(type);
    for (int64_t num_tokens : {min_tokens, int64_t{47}}) {
      SCOPED_TRACE(fmt::format("{} tokens {}", ggml_type_name(type), num_tokens));
      expect_reference_on_one_and_three_threads(Isa::kAvx2, w, num_tokens, seed++);
    }
  }
}

// Q8_0 batches on AVX2 take int16 column pairs (matmul_wide_panels_avx2.cc), staged in slices
// of 64 blocks that add to what earlier slices left in y: 4256 columns are slices of 64, 64 and
// 5 blocks; 333 rows end in a 5-row panel, and stages or a thread's rows end in a single panel
// (the 8-row tile) as well as pairs; 16 and 17 tokens end in a 1- and a 2-token tile.
TEST(MatmulAvx2Panels, Q8_0PairsOverSlicesAndRaggedTiles) {
  if (!ops_internal::isa_supported(Isa::kAvx2)) GTEST_SKIP() << "avx2 is not available on this CPU";
  const TestWeights w = make_weights(GgmlType::kQ8_0, 333, 4256, 61);
  for (int64_t num_tokens : {16, 17}) {
    SCOPED_TRACE(fmt::format("tokens {}", num_tokens));
    ASSERT_TRUE(ops_internal::avx2_panels_take_batch(Isa::kAvx2, GgmlType::kQ8_0, num_tokens));
    const uint64_t before = ops_internal::avx2_panel_kernel_runs();
    expect_reference_on_one_and_three_threads(Isa::kAvx2, w, num_tokens, 62 + static_cast<uint32_t>(num_tokens));
    ASSERT_GT(ops_internal::avx2_panel_kernel_runs(), before) << "the AVX2 panel kernel did not run";
  }
}

INSTANTIATE_TEST_SUITE_P(TypesAndIsas, MatmulTest, ::testing::ValuesIn(all_type_isas()),
                         [](const ::testing::TestParamInfo<TypeIsa>& info) {
                           return type_isa_name(info.param.type, info.param.isa);
                         });

TEST(Matmul, RawQuantizedBlocksWithEveryByteValue) {
  ThreadPool pool(2);
  for (GgmlType type : all_types()) {
    if (!is_quantized(type)) continue;
    const TestWeights w = make_raw_blocks(type, 9, is_super_block(type) ? 512 : 160, 11);
    for (int64_t num_tokens : {5, 17}) {  // row kernels; batch kernels (AVX2 panels)
      const std::vector<float> x = make_activations(num_tokens, w.cols, 12);
      for (Isa isa : ops_internal::available_isas()) {
        SCOPED_TRACE(fmt::format("{} tokens {}", type_isa_name(type, isa), num_tokens));
        std::vector<float> y(num_tokens * w.rows, NAN);
        matmul_on(isa, w.matrix(), x.data(), y.data(), num_tokens, pool);
        expect_matches_reference(w, x, y, num_tokens, isa);
      }
    }
  }
}

// Activations of equal magnitude quantize to ±127 everywhere: with raw blocks (largest codes
// and scales included) the kernels' int16 pair sums and int32 block sums reach their largest
// values, which must stay exact (no vpmaddubsw saturation, no overflow).
TEST(Matmul, LargestOperandsStayExact) {
  ThreadPool pool(2);
  std::mt19937 rng(5);
  for (GgmlType type : all_types()) {
    if (!is_quantized(type)) continue;
    const TestWeights w = make_raw_blocks(type, 5, 512, 13);
    // All +1, all -1, random signs; 3 tokens take the row kernels, 17 the batch kernels (AVX2
    // panels, whose int16 block sums are then largest).
    for (int64_t num_tokens : {3, 17}) {
      std::vector<float> x(num_tokens * w.cols);
      for (int64_t t = 0; t < num_tokens; ++t) {
        for (int64_t c = 0; c < w.cols; ++c) {
          x[t * w.cols + c] = t % 3 == 0 ? 1.0f : t % 3 == 1 ? -1.0f : rng() % 2 ? 1.0f : -1.0f;
        }
      }
      for (Isa isa : ops_internal::available_isas()) {
        SCOPED_TRACE(fmt::format("{} tokens {}", type_isa_name(type, isa), num_tokens));
        std::vector<float> y(num_tokens * w.rows, NAN);
        matmul_on(isa, w.matrix(), x.data(), y.data(), num_tokens, pool);
        expect_matches_reference(w, x, y, num_tokens, isa);
      }
    }
  }
}

// Every 16-bit pattern as a weight, picked out by one-hot activations: the in-register
// f16 / bf16 conversions must be exact, subnormals included.
TEST(Matmul, HalfWeightsConvertExactly) {
  ThreadPool pool(2);
  const int64_t rows = 2048;
  const int64_t cols = 32;
  std::vector<float> x(cols * cols, 0.0f);  // token t is the unit vector e_t
  for (int64_t t = 0; t < cols; ++t) x[t * cols + t] = 1.0f;
  for (GgmlType type : {GgmlType::kF16, GgmlType::kBF16}) {
    TestWeights w{type, rows, cols, std::vector<uint8_t>(rows * cols * 2), std::vector<float>(rows * cols)};
    for (int64_t i = 0; i < rows * cols; ++i) {
      uint16_t bits = static_cast<uint16_t>(i);
      const float v = type == GgmlType::kF16 ? fp16_to_fp32(bits) : bf16_to_fp32(bits);
      if (!std::isfinite(v)) bits = 0;  // inf/nan times 0 would poison the sums
      std::memcpy(&w.bytes[2 * i], &bits, 2);
      w.dequant[i] = type == GgmlType::kF16 ? fp16_to_fp32(bits) : bf16_to_fp32(bits);
    }
    for (Isa isa : ops_internal::available_isas()) {
      std::vector<float> y(cols * rows);
      ops_internal::matmul_with_isa(isa, w.matrix(), x.data(), y.data(), cols, pool);
      for (int64_t t = 0; t < cols; ++t) {
        for (int64_t r = 0; r < rows; ++r) {
          ASSERT_EQ(y[t * rows + r], w.dequant[r * cols + t])
              << type_isa_name(type, isa) << " pattern " << r * cols + t;
        }
      }
    }
  }
}

TEST(Matmul, PublicEntryUsesBestIsa) {
  ThreadPool pool(2);
  for (GgmlType type : {GgmlType::kF16, GgmlType::kQ4_0}) {
    const TestWeights w = make_weights(type, 20, 128, 31);
    const std::vector<float> x = make_activations(3, w.cols, 32);
    std::vector<float> y_public(3 * w.rows), y_best(3 * w.rows);
    matmul(w.matrix(), x.data(), y_public.data(), 3, pool);
    ops_internal::matmul_with_isa(ops_internal::best_isa(), w.matrix(), x.data(), y_best.data(), 3, pool);
    EXPECT_EQ(std::memcmp(y_public.data(), y_best.data(), y_best.size() * sizeof(float)), 0);
  }
}

TEST(Matmul, ZeroTokensWritesNothing) {
  ThreadPool pool(1);
  const TestWeights w = make_weights(GgmlType::kF32, 4, 32, 41);
  const float x = 0.0f;
  float y = 123.0f;
  matmul(w.matrix(), &x, &y, 0, pool);
  EXPECT_EQ(y, 123.0f);
}

TEST(MatmulDeathTest, RejectsInconsistentRowBytes) {
  const TestWeights w = make_weights(GgmlType::kQ8_0, 2, 64, 51);
  WeightMatrix bad = w.matrix();
  bad.row_bytes += 1;
  std::vector<float> x(64), y(2);
  ThreadPool pool(1);
  EXPECT_DEATH(matmul(bad, x.data(), y.data(), 1, pool), "row_bytes");
}

TEST(DequantizeWeightRow, MatchesReference) {
  for (GgmlType type : all_types()) {
    const TestWeights w = make_weights(type, 5, is_super_block(type) ? 512 : 96, 61);
    std::vector<float> row(w.cols);
    for (int64_t r = 0; r < w.rows; ++r) {
      dequantize_weight_row(w.matrix(), r, row.data());
      ASSERT_EQ(std::memcmp(row.data(), &w.dequant[r * w.cols], w.cols * sizeof(float)), 0)
          << ggml_type_name(type) << " row " << r;
    }
  }
}

// ---- activation quantization ----

struct QuantizedCopy {
  std::vector<int8_t> qs;
  std::vector<float> scales;
  std::vector<int32_t> bias;
};

QuantizedCopy quantize_with(Isa isa, const std::vector<float>& x, int64_t num_tokens, int64_t cols, int32_t offset) {
  const int64_t num_blocks = cols / 32;
  ops_internal::ActivationBuffer buffer;
  const ops_internal::QuantizedActivations q = buffer.view(num_tokens, num_blocks);
  std::memset(q.bias, 0, num_tokens * num_blocks * 8 * sizeof(int32_t));
  // Two calls over token ranges, as the thread split does.
  const int64_t split = num_tokens / 2;
  auto quantize = isa == Isa::kAvx512 || isa == Isa::kAmx ? ops_internal::quantize_activations_avx512
                  : isa == Isa::kAvx2 ? ops_internal::quantize_activations_avx2
                                      : ops_internal::quantize_activations_portable;
  quantize(x.data(), cols, 0, split, offset, q);
  quantize(x.data(), cols, split, num_tokens, offset, q);
  const int64_t n = num_tokens * num_blocks;
  return QuantizedCopy{std::vector<int8_t>(q.qs, q.qs + n * 32), std::vector<float>(q.scales, q.scales + n),
                       std::vector<int32_t>(q.bias, q.bias + n * 8)};
}

TEST(QuantizeActivations, BoundedErrorAndBiasLanes) {
  const int64_t num_tokens = 3;
  const int64_t cols = 128;
  std::vector<float> x = make_activations(num_tokens, cols, 71);
  for (int i = 0; i < 32; ++i) x[32 + i] = 0.0f;  // an all-zero block
  for (int32_t offset : {0, 8, 128}) {
    const QuantizedCopy q = quantize_with(Isa::kPortable, x, num_tokens, cols, offset);
    for (int64_t block = 0; block < num_tokens * cols / 32; ++block) {
      float amax = 0.0f;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[block * 32 + i]));
      const float d = q.scales[block];
      ASSERT_EQ(d, amax / 127.0f);
      for (int lane = 0; lane < 8; ++lane) {
        int32_t lane_sum = 0;
        for (int i = 0; i < 4; ++i) {
          const int idx = lane * 4 + i;
          const int8_t v = q.qs[block * 32 + idx];
          ASSERT_GE(v, -127);
          ASSERT_LE(v, 127);
          ASSERT_LE(std::fabs(x[block * 32 + idx] - d * v), 0.5f * d * (1.0f + 1e-4f)) << "block " << block;
          lane_sum += v;
        }
        if (offset != 0) {
          ASSERT_EQ(q.bias[block * 8 + lane], -offset * lane_sum);
        }
      }
    }
  }
}

TEST(QuantizeActivations, EveryIsaIsBitIdentical) {
  const int64_t num_tokens = 5;
  const int64_t cols = 256;
  std::vector<float> x = make_activations(num_tokens, cols, 81);
  // A block of exact ties: amax 127 makes the scale 1, so k + 0.5 must round to even.
  for (int i = 0; i < 32; ++i) x[i] = i == 0 ? 127.0f : static_cast<float>(i % 9) - 4.5f;
  for (int32_t offset : {0, 8, 128}) {
    const QuantizedCopy ref = quantize_with(Isa::kPortable, x, num_tokens, cols, offset);
    EXPECT_EQ(ref.qs[1], -4);  // -3.5 → -4
    EXPECT_EQ(ref.qs[2], -2);  // -2.5 → -2
    for (Isa isa : ops_internal::available_isas()) {
      const QuantizedCopy q = quantize_with(isa, x, num_tokens, cols, offset);
      EXPECT_EQ(q.qs, ref.qs) << ops_internal::isa_name(isa);
      EXPECT_EQ(q.scales, ref.scales) << ops_internal::isa_name(isa);
      EXPECT_EQ(q.bias, ref.bias) << ops_internal::isa_name(isa);
    }
  }
}

// The AVX-512 super-block row kernel takes its activations in each type's unpack order: every
// stored block must be the natural one permuted, with the same scale and per-16 sums.
TEST(QuantizeActivations, SuperBlockOrderPermutesEachBlock) {
  const int64_t num_tokens = 3;
  const int64_t cols = 512;
  const std::vector<float> x = make_activations(num_tokens, cols, 91);
  ops_internal::ActivationBuffer natural_buffer, ordered_buffer;
  const ops_internal::SuperBlockActivations natural = natural_buffer.super_view(num_tokens, cols / 256);
  ops_internal::quantize_superblock_activations(x.data(), cols, 0, num_tokens, natural);
  int reordered_types = 0;
  for (GgmlType type : {GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K,
                        GgmlType::kIQ4_XS}) {
    const uint8_t* runs = ops_internal::avx512_super_activation_order(type);
    if (runs == nullptr) continue;  // element order: the kernel reads the natural layout
    ++reordered_types;
    std::vector<bool> seen(16, false);
    for (int r = 0; r < 16; ++r) {
      ASSERT_LT(runs[r], 16);
      seen[runs[r]] = true;
    }
    ASSERT_EQ(std::count(seen.begin(), seen.end(), true), 16) << ggml_type_name(type) << ": not a permutation";
    const ops_internal::SuperBlockActivations ordered = ordered_buffer.super_view(num_tokens, cols / 256);
    ops_internal::quantize_superblock_activations(x.data(), cols, 0, num_tokens, ordered, runs);
    for (int64_t block = 0; block < num_tokens * cols / 256; ++block) {
      ASSERT_EQ(ordered.scales[block], natural.scales[block]);
      for (int i = 0; i < 256; ++i) {
        ASSERT_EQ(ordered.qs[block * 256 + i], natural.qs[block * 256 + 16 * runs[i / 16] + i % 16])
            << ggml_type_name(type) << " " << i;
      }
      for (int s = 0; s < 16; ++s) ASSERT_EQ(ordered.bsums[block * 16 + s], natural.bsums[block * 16 + s]);
    }
  }
  EXPECT_EQ(reordered_types, 5);  // all but Q6_K, whose unpack order is the element order
  EXPECT_EQ(ops_internal::avx512_super_activation_order(GgmlType::kQ8_0), nullptr);
}

// The AVX2 super-block quantizer (every ISA above portable takes it) against the portable one:
// bit-identical, in element order and in every reordered type's order, with ties that must
// round to even and an all-zero block.
TEST(QuantizeActivations, SuperBlockAvx2IsBitIdentical) {
  if (!ops_internal::isa_supported(Isa::kAvx2)) GTEST_SKIP() << "this CPU has no AVX2";
  const int64_t num_tokens = 4;
  const int64_t cols = 768;
  std::vector<float> x = make_activations(num_tokens, cols, 93);
  for (int i = 0; i < 256; ++i) x[i] = i == 0 ? 127.0f : static_cast<float>(i % 11) - 5.5f;  // exact ties
  for (int i = 0; i < 256; ++i) x[256 + i] = 0.0f;                                         // a zero block
  std::vector<const uint8_t*> orders = {nullptr};
  for (GgmlType type : {GgmlType::kQ2_K, GgmlType::kQ4_K, GgmlType::kIQ4_XS}) {
    orders.push_back(ops_internal::avx512_super_activation_order(type));
  }
  for (const uint8_t* order : orders) {
    ops_internal::ActivationBuffer ref_buffer, avx2_buffer;
    const ops_internal::SuperBlockActivations ref = ref_buffer.super_view(num_tokens, cols / 256);
    const ops_internal::SuperBlockActivations avx2 = avx2_buffer.super_view(num_tokens, cols / 256);
    ops_internal::quantize_superblock_activations(x.data(), cols, 0, num_tokens, ref, order);
    ops_internal::quantize_superblock_activations_avx2(x.data(), cols, 0, num_tokens, avx2, order);
    const int64_t num = num_tokens * cols / 256;
    EXPECT_EQ(ref.qs[1], -4);  // -4.5 → -4
    EXPECT_EQ(std::vector<int8_t>(ref.qs, ref.qs + num * 256), std::vector<int8_t>(avx2.qs, avx2.qs + num * 256));
    EXPECT_EQ(std::vector<float>(ref.scales, ref.scales + num), std::vector<float>(avx2.scales, avx2.scales + num));
    EXPECT_EQ(std::vector<int16_t>(ref.bsums, ref.bsums + num * 16),
              std::vector<int16_t>(avx2.bsums, avx2.bsums + num * 16));
  }
}

}  // namespace
}  // namespace kvlm
