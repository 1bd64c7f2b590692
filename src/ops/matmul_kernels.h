// Internal to ops/: the per-ISA matmul kernels behind matmul() and the quantized activation
// format they share. Tests call each ISA directly so every path this CPU can run is checked.
#pragma once

#include <cstdint>
#include <memory>

#include "core/thread_pool.h"
#include "ops/isa.h"
#include "ops/matmul.h"

namespace kvlm::ops_internal {

// Activations quantized for integer dot products with Q8_0 / Q4_0 weights: each block of
// 32 values of a token becomes int8 q with x ≈ d·q, d = amax/127, q rounded to nearest even.
// SIMD kernels form int32 partial dots over 4 consecutive elements ("lanes", 8 per block),
// so the bias is stored once per lane and loads as a vector directly.
// Every ISA's quantizer produces bit-identical contents.
struct QuantizedActivations {
  int64_t num_tokens = 0;
  int64_t num_blocks = 0;   // per token: cols / 32
  int8_t* qs = nullptr;     // [num_tokens, num_blocks, 32]
  float* scales = nullptr;  // [num_tokens, num_blocks]      d of each block
  int32_t* bias = nullptr;  // [num_tokens, num_blocks, 8]   -bias_offset · (sum of the lane's 4 q)
  int32_t* sums = nullptr;  // [num_tokens, num_blocks]      Σ q of the block (Q4_1, Q5_1: min; Q5_0: offset)

  // Bytes one token takes in the four arrays.
  static int64_t bytes_per_token(int64_t num_blocks) { return num_blocks * (32 + 4 + 8 * 4 + 4); }
};

// Q4_0 activations for the AVX2 row kernels: each token's blocks in pairs (2j, 2j + 1), laid out
// so that one 256-bit unpack of the two weight blocks' nibbles meets them (low nibbles: elements
// 0-15 of both blocks, high nibbles: 16-31), and the bias lanes the pair's dot then needs.
// A last unpaired block stays in QuantizedActivations' layout.
struct Q4PairActivations {
  int64_t num_pairs = 0;    // per token: num_blocks / 2
  int8_t* qs = nullptr;     // [num_tokens, num_pairs, 64]: x_2j[0:16] x_2j+1[0:16] x_2j[16:32] x_2j+1[16:32]
  int32_t* bias = nullptr;  // [num_tokens, num_pairs, 8]:  lanes 0-3 block 2j, 4-7 block 2j + 1

  static int64_t bytes_per_token(int64_t num_pairs) { return num_pairs * (64 + 8 * 4); }
};

// Activations for the 256-element super-block types (K-quants, IQ4_XS), as GGML's Q8_K: each
// 256 values of a token become int8 q with x ≈ d·q, d = amax/127 (round to nearest even), and
// the sums of each 16 consecutive q, which the weights' per-sub-block mins multiply.
struct SuperBlockActivations {
  int64_t num_tokens = 0;
  int64_t num_blocks = 0;   // per token: cols / 256
  int8_t* qs = nullptr;     // [num_tokens, num_blocks, 256]
  float* scales = nullptr;  // [num_tokens, num_blocks]
  int16_t* bsums = nullptr; // [num_tokens, num_blocks, 16]   (|Σ of 16 q| ≤ 2032)

  static int64_t bytes_per_token(int64_t num_blocks) { return num_blocks * (256 + 4 + 16 * 2); }
};

// Which activation format a weight type's integer kernels take.
enum class ActivationFormat { kNone, kBlocks32, kSuperBlocks };
ActivationFormat activation_format(GgmlType type);

// Quantizes tokens [token_begin, token_end) of x: [num_tokens, cols] into out (portable; the
// reference for the AVX2 version below).
// run_order (16 entries, or nullptr for element order) stores elements 16·run_order[r] ..
// 16·run_order[r] + 15 of each block at qs positions 16r .. 16r + 15, for kernels whose unpacked
// codes come in another order; bsums stay by element.
void quantize_superblock_activations(const float* x, int64_t cols, int64_t token_begin, int64_t token_end,
                                     const SuperBlockActivations& out, const uint8_t* run_order = nullptr);
// The same with AVX2 (bit-identical): decode quantizes one token on one thread while the other
// threads wait, once per matmul.
void quantize_superblock_activations_avx2(const float* x, int64_t cols, int64_t token_begin, int64_t token_end,
                                          const SuperBlockActivations& out, const uint8_t* run_order = nullptr);

// A witness of which ISA's kernels ran: every matmul kernel entry adds 1 to its ISA's count, so
// a test parameterised over ISAs asserts the one it names really ran (not a fallback).
uint64_t isa_kernel_runs(Isa isa);
void count_isa_kernel_run(Isa isa);

// The same activations regrouped for kernels that hold one token per 32-bit lane: 16 tokens
// side by side, so one vpdpbusd multiplies 4 elements of one weight row (broadcast) with the
// same 4 elements of 16 tokens, and a block's int32 dot completes before any float work.
// The quants stay signed, vpdpbusd's signed operand; the weights are its unsigned one (Q8_0
// + 128, Q4_0's nibbles as stored, + 8), so kernels subtract offset · (the block's Σq), which
// `sums` holds per token: a vector per block shared by every weight row.
// Built from a QuantizedActivations by interleave_token_groups. The last group may be partly
// padding (lanes past num_tokens: q = 0, scale 0), whose outputs are never stored.
struct TokenGroupActivations {
  static constexpr int kTokens = 16;
  int64_t num_groups = 0;
  int64_t num_tokens = 0;  // valid tokens: group g lane i is token g·16 + i when below this
  int64_t num_blocks = 0;
  int8_t* qs = nullptr;     // [num_groups, num_blocks, 8 lanes, kTokens, 4]
  float* scales = nullptr;  // [num_groups, num_blocks, kTokens]
  int32_t* sums = nullptr;  // [num_groups, num_blocks, kTokens]   Σ q of the token's block
  // [num_groups, num_blocks, kTokens]   Σ q of the block's first 16 elements (the super-block
  // kernel's types with 16-element sub-blocks scale the halves apart)
  int32_t* half_sums = nullptr;

  static int64_t bytes_per_token(int64_t num_blocks) { return num_blocks * (32 + 4 + 4 + 4); }
};

// Activations for the AMX kernel: groups of 16 tokens as bf16 (rounded to nearest even), each 32
// columns of a group one B tile of TDPBF16PS: 16 rows (column pairs) × 16 tokens × 2 values.
// Lanes past num_tokens are zeros.
struct Bf16TokenGroups {
  static constexpr int kTokens = 16;
  static constexpr int kChunk = 32;  // columns per tile
  int64_t num_groups = 0;
  int64_t num_tokens = 0;
  int64_t num_chunks = 0;    // cols / 32
  uint16_t* qs = nullptr;    // [num_groups, num_chunks, 16 pairs, kTokens, 2]

  const uint16_t* tile(int64_t group, int64_t chunk) const { return qs + (group * num_chunks + chunk) * 512; }
};

// Converts token groups [group_begin, group_end) of x: [num_tokens, cols] (AVX-512 BF16).
void convert_bf16_token_groups(const float* x, int64_t cols, int64_t group_begin, int64_t group_end,
                               const Bf16TokenGroups& out);

// 64-byte aligned scratch that grows and never shrinks; carves the arrays of the formats.
class ActivationBuffer {
 public:
  QuantizedActivations view(int64_t num_tokens, int64_t num_blocks);
  SuperBlockActivations super_view(int64_t num_tokens, int64_t num_blocks);
  TokenGroupActivations group_view(int64_t num_groups, int64_t num_tokens, int64_t num_blocks);
  Bf16TokenGroups bf16_view(int64_t num_groups, int64_t num_tokens, int64_t num_chunks);
  // At least `bytes` bytes, 64-byte aligned: the kernels' own staging (weight panels, row blocks).
  uint8_t* reserve(int64_t bytes);

 private:
  std::unique_ptr<uint8_t[]> storage_;
  int64_t capacity_ = 0;
};

// Copies token groups [group_begin, group_end) of xq (token g·16 + i is lane i of group g),
// padding lanes past out.num_tokens.
void interleave_token_groups(const QuantizedActivations& xq, int64_t group_begin, int64_t group_end,
                             const TokenGroupActivations& out);

// Quantizes tokens [token_begin, token_end) of x: [num_tokens, cols] into out.
// bias_offset is what the ISA's kernel adds to each weight before its integer dot
// (activation_bias_offset), so the bias lanes cancel it; 0 leaves bias unwritten.
using QuantizeActivationsFn = void (*)(const float* x, int64_t cols, int64_t token_begin, int64_t token_end,
                                       int32_t bias_offset, const QuantizedActivations& out);
void quantize_activations_portable(const float* x, int64_t cols, int64_t token_begin, int64_t token_end,
                                   int32_t bias_offset, const QuantizedActivations& out);
void quantize_activations_avx2(const float* x, int64_t cols, int64_t token_begin, int64_t token_end,
                               int32_t bias_offset, const QuantizedActivations& out);
void quantize_activations_avx512(const float* x, int64_t cols, int64_t token_begin, int64_t token_end,
                                 int32_t bias_offset, const QuantizedActivations& out);

// The unsigned offset an ISA's integer kernel adds to weight values of `type`
// (Q4_0 nibbles are stored +8; VNNI needs unsigned × signed, so Q8_0 weights get +128 there).
int32_t activation_bias_offset(Isa isa, GgmlType type);

// One call's operands. Row kernels compute y[t][r] for t in [token_begin, token_end) and the
// rows they are given; the token-group kernel computes the tokens of groups
// [group_begin, group_end). Each element is summed in an order fixed by (cols, type, ISA,
// kernel) alone, so results do not depend on how rows are split over threads, nor on the
// other tokens of the batch beyond which kernel a token falls to (token_groups_for_batch).
struct MatmulProblem {
  const WeightMatrix* w = nullptr;
  const float* x = nullptr;                   // [num_tokens, cols] f32 (F32/F16/BF16 weights)
  const QuantizedActivations* xq = nullptr;   // quantized x (32-element block types)
  const SuperBlockActivations* xk = nullptr;  // quantized x (256-element super-block types)
  const TokenGroupActivations* xg = nullptr;  // xq regrouped (token-group kernel)
  const Bf16TokenGroups* xb = nullptr;        // x as bf16 groups (AMX kernel)
  const int16_t* x16 = nullptr;               // xq's values as int16, [num_tokens, cols] (AVX2 Q8_0 panels)
  const Q4PairActivations* x4 = nullptr;      // xq in block pairs (AVX2 Q4_0 row kernel)
  float* y = nullptr;                         // [num_tokens, rows]
  int64_t token_begin = 0;
  int64_t token_end = 0;
  int64_t group_begin = 0;
  int64_t group_end = 0;
};

using MatmulRowsFn = void (*)(const MatmulProblem& p, int64_t row_begin, int64_t row_end);
void matmul_rows_portable(const MatmulProblem& p, int64_t row_begin, int64_t row_end);
void matmul_rows_avx2(const MatmulProblem& p, int64_t row_begin, int64_t row_end);
void matmul_rows_avx512(const MatmulProblem& p, int64_t row_begin, int64_t row_end);
// The types added after Q8_0 / Q4_0 (Q4_1, Q5_x, IQ4_NL, K-quants, IQ4_XS). Portable: each weight
// block is decoded once per row into int8 values and integer sub-block scales (matmul_decode.h),
// then multiplied with every token of the chunk. AVX2 / AVX-512 (32-element blocks only): fused
// kernels that decode each block into a register shared by a rows × tokens tile.
void matmul_rows_decoded_portable(const MatmulProblem& p, int64_t row_begin, int64_t row_end);
void matmul_rows_decoded_avx2(const MatmulProblem& p, int64_t row_begin, int64_t row_end);
void matmul_rows_decoded_avx512(const MatmulProblem& p, int64_t row_begin, int64_t row_end);
// The super-block types (K-quants, IQ4_XS) on AVX2 / AVX-512: fused kernels that dot the packed
// codes in registers with the activations (matmul_super_decode_avx2.h), in rows × tokens tiles.
void matmul_rows_super_avx2(const MatmulProblem& p, int64_t row_begin, int64_t row_end);
void matmul_rows_super_avx512(const MatmulProblem& p, int64_t row_begin, int64_t row_end);
// The order of 16-element runs matmul_rows_super_avx512 takes type's activations in (see
// quantize_superblock_activations); nullptr when that is element order.
const uint8_t* avx512_super_activation_order(GgmlType type);
// Q8_0 / Q4_0 only, on p.xg; about twice the rows kernel's throughput for batches.
void matmul_token_groups_avx512(const MatmulProblem& p, int64_t row_begin, int64_t row_end);
// The super-block types (K-quants, IQ4_XS) on p.xg (matmul_super_groups_avx512.cc): each tile of
// rows staged as one code per byte with f32 half-block scales, then the groups run over it.
void matmul_super_token_groups_avx512(const MatmulProblem& p, int64_t row_begin, int64_t row_end);
// Batches of at least this many tokens of a super-block type take that kernel on Isa::kAvx512
// and Isa::kAmx, every token in a group (the last one padded): the row kernels take another
// activation format. Measured: see matmul.cc.
int64_t avx512_super_group_min_tokens();
bool avx512_super_groups_take_batch(Isa isa, GgmlType type, int64_t num_tokens);
// Runs of that kernel, a witness for the tests (as avx2_panel_kernel_runs).
uint64_t avx512_super_group_kernel_runs();
void count_avx512_super_group_kernel_run();
// Groups of 16 tokens on AMX BF16 tiles, on p.xb (Q8_0 / Q4_0; weights rounded to bf16).
void matmul_token_groups_amx(const MatmulProblem& p, int64_t row_begin, int64_t row_end);
// How many groups of 16 tokens (the last possibly partial) matmul_with_isa sends to the
// token-group kernel for a batch; tokens past them take the row kernel. 0 where the ISA has
// no token-group kernel for the type.
int64_t token_groups_for_batch(Isa isa, GgmlType type, int64_t num_tokens);
// Batches of at least this many Q8_0 / Q4_0 tokens take the AMX kernel on Isa::kAmx (its groups
// are then token_groups_for_batch's); smaller ones take the AVX-512 kernels, which are faster
// there: each AMX call first dequantizes the weights to bf16, once per call. Measured (2048²
// Q8_0, 2 threads, Sapphire Rapids): AMX / AVX-512 1.06x the time at 64 tokens, 0.76x at 128.
constexpr int64_t kAmxMinTokens = 128;
bool amx_takes_batch(Isa isa, GgmlType type, int64_t num_tokens);

// Batches on AVX2 (matmul_panels_avx2.cc) of the types avx2_panels_support names (Q8_0, Q4_0,
// the K-quants, IQ4_XS): each thread stages its rows as 8-row panels of 4-bit codes, once per
// call, and runs 3-4 token tiles over them, on p.xq (32-element blocks), except for the types
// avx2_super_panels_support names.
void matmul_panels_avx2(const MatmulProblem& p, int64_t row_begin, int64_t row_end);
bool avx2_panels_support(GgmlType type);
// K-quant batches on AVX2 (matmul_super_panels_avx2.cc; matmul_panels_avx2 hands them over): the
// same panels with the rows' sub-block scales applied in int32, on p.xk (super-block activations,
// element order).
void matmul_super_panels_avx2(const MatmulProblem& p, int64_t row_begin, int64_t row_end);
bool avx2_super_panels_support(GgmlType type);
// Tokens [token_begin, token_end) of xq (quantized with Q4_0's bias offset) into out's pairs.
void pair_q4_activations(const QuantizedActivations& xq, int64_t token_begin, int64_t token_end,
                         const Q4PairActivations& out);

// Q8_0 batches on AVX2 (matmul_wide_panels_avx2.cc): weights staged as int16 column pairs,
// multiplied by vpmaddwd; same results as the code panels, fewer ALU ops per product.
void matmul_wide_panels_avx2(const MatmulProblem& p, int64_t row_begin, int64_t row_end);
// xq's int8 values of tokens [token_begin, token_end) as int16 into out ([num_tokens, cols]),
// once per call for every thread of the kernel above.
void widen_activations_avx2(const QuantizedActivations& xq, int64_t token_begin, int64_t token_end, int16_t* out);
// Batches of at least this many tokens take it on Isa::kAvx2; smaller ones the row kernels,
// for which staging the weights is not worth it. Measured after the staging was made cheaper
// (c89c520; kvlm_microbench matmul_isa 2048², weights cold in DRAM, 2 threads, Zen 5 with
// KVLM_CPU=avx2, two interleaved rounds, panels / rows time): Q8_0 0.96-1.08x at 8, 0.93-1.01x
// at 10, 0.93-0.94x at 12; Q4_0 1.13-1.23x at 6, 0.93-0.99x at 8; Q4_K 1.05-1.08x at 6,
// 0.88-0.93x at 8; Q2_K, Q3_K, Q5_K 1.06-1.28x at 6, 0.86-0.96x at 8; Q6_K 1.12-1.16x at 8,
// 0.95-0.96x at 10; IQ4_XS (two planes) 1.04-1.14x at 8, 0.90-1.06x at 10, 0.83-0.97x at 12.
// Each type switches where the panels first measured ahead in both rounds.
int64_t avx2_panel_min_tokens(GgmlType type);
bool avx2_panels_take_batch(Isa isa, GgmlType type, int64_t num_tokens);
// Its own witness (beside the AVX2 count): tests that expect the panels assert they ran.
uint64_t avx2_panel_kernel_runs();
void count_avx2_panel_kernel_run();

// matmul() on a chosen ISA (which the CPU must support): quantizes x if the weight type
// needs it, then splits rows over the pool.
void matmul_with_isa(Isa isa, const WeightMatrix& w, const float* x, float* y, int64_t num_tokens, ThreadPool& pool);
// matmul_shared_input() on a chosen ISA, for matrices that all have one type and width.
void matmul_shared_input_with_isa(Isa isa, std::span<const MatmulOutput> outs, const float* x, int64_t num_tokens,
                                  ThreadPool& pool);

}  // namespace kvlm::ops_internal
