// matmul(): argument checks, ISA dispatch, activation quantization and the split over threads.
#include "ops/matmul.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <span>
#include <vector>

#include "core/check.h"
#include "core/quantize.h"
#include "ops/matmul_kernels.h"

namespace kvlm {
namespace ops_internal {
namespace {

// Rows are handed to threads in groups of this many: a multiple of every kernel's row tile,
// so only the last group of a matrix runs a remainder tile.
constexpr int64_t kRowGroup = 4;
constexpr int64_t kAmxRowGroup = 16;  // the AMX kernel's panels
constexpr int64_t kPanelRowGroup = 8;  // the AVX2 panel kernel's
// A thread's share should be worth waking it for.
constexpr int64_t kMinMacsPerChunk = 1 << 16;
// Activations of one token chunk should stay in L2 while every row of a thread's range
// is multiplied with them; longer batches re-stream the weights once per chunk.
constexpr int64_t kActivationBytesPerChunk = 384 << 10;

// Q8_0 / Q4_0 have hand-tiled kernels (and the token-group kernel); the later types go
// through the decoded-block kernels.
bool is_classic_quantized(GgmlType type) { return type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0; }

// Types whose kernels need Σq of each activation block: a min (Q4_1, Q5_1), or codes stored
// with an offset that the kernel takes out afterwards (Q5_0, +16).
bool needs_block_sums(GgmlType type) {
  return type == GgmlType::kQ4_1 || type == GgmlType::kQ5_1 || type == GgmlType::kQ5_0;
}

std::atomic<uint64_t> g_kernel_runs[4];
std::atomic<uint64_t> g_avx2_panel_runs;
std::atomic<uint64_t> g_avx512_super_group_runs;

MatmulRowsFn decoded_rows_fn(Isa isa, ActivationFormat format) {
  const bool super = format == ActivationFormat::kSuperBlocks;
  switch (isa) {
    case Isa::kAvx2:
      return super ? matmul_rows_super_avx2 : matmul_rows_decoded_avx2;
    case Isa::kAvx512:
    case Isa::kAmx:
      return super ? matmul_rows_super_avx512 : matmul_rows_decoded_avx512;
    case Isa::kPortable:
      break;
  }
  return matmul_rows_decoded_portable;
}

MatmulRowsFn rows_fn(Isa isa) {
  switch (isa) {
    case Isa::kAvx2:
      return matmul_rows_avx2;
    case Isa::kAvx512:
    case Isa::kAmx:  // tokens outside the tile kernel's groups
      return matmul_rows_avx512;
    case Isa::kPortable:
      break;
  }
  return matmul_rows_portable;
}

QuantizeActivationsFn quantize_fn(Isa isa) {
  switch (isa) {
    case Isa::kAvx2:
      return quantize_activations_avx2;
    case Isa::kAvx512:
    case Isa::kAmx:
      return quantize_activations_avx512;
    case Isa::kPortable:
      break;
  }
  return quantize_activations_portable;
}

void check_weight(const WeightMatrix& w) {
  const GgmlTypeTraits traits = ggml_type_traits(w.type);
  KVLM_CHECK(w.type == GgmlType::kF32 || w.type == GgmlType::kF16 || w.type == GgmlType::kBF16 ||
                 activation_format(w.type) != ActivationFormat::kNone,
             "matmul does not support weight type {}", traits.name);
  KVLM_CHECK(w.data != nullptr && w.rows > 0 && w.cols > 0, "empty weight matrix ({} x {})", w.rows, w.cols);
  KVLM_CHECK(w.cols % traits.block_size == 0, "{} weight with {} cols: not a whole number of blocks of {}", traits.name,
             w.cols, traits.block_size);
  KVLM_CHECK(w.row_bytes == ggml_row_bytes(w.type, w.cols), "{} weight with {} cols has row_bytes {}, expected {}",
             traits.name, w.cols, w.row_bytes, ggml_row_bytes(w.type, w.cols));
}

// Scratch for quantized activations, one per calling thread: matmul() is not reentrant on a
// thread, and workers only read the buffer while the caller waits inside run().
ActivationBuffer& scratch_activations() {
  thread_local ActivationBuffer buffer;
  return buffer;
}

ActivationBuffer& scratch_token_groups() {
  thread_local ActivationBuffer buffer;
  return buffer;
}

// The activations rearranged for one kernel: widened to int16 (AVX2 Q8_0 panels) or in block
// pairs (AVX2 Q4_0 rows).
ActivationBuffer& scratch_regrouped_activations() {
  thread_local ActivationBuffer buffer;
  return buffer;
}

}  // namespace

ActivationFormat activation_format(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kIQ4_NL:
      return ActivationFormat::kBlocks32;
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
    case GgmlType::kIQ4_XS:
      return ActivationFormat::kSuperBlocks;
    default:
      return ActivationFormat::kNone;
  }
}

uint64_t isa_kernel_runs(Isa isa) { return g_kernel_runs[static_cast<int>(isa)].load(std::memory_order_relaxed); }
void count_isa_kernel_run(Isa isa) { g_kernel_runs[static_cast<int>(isa)].fetch_add(1, std::memory_order_relaxed); }
uint64_t avx2_panel_kernel_runs() { return g_avx2_panel_runs.load(std::memory_order_relaxed); }
void count_avx2_panel_kernel_run() { g_avx2_panel_runs.fetch_add(1, std::memory_order_relaxed); }
uint64_t avx512_super_group_kernel_runs() { return g_avx512_super_group_runs.load(std::memory_order_relaxed); }
void count_avx512_super_group_kernel_run() { g_avx512_super_group_runs.fetch_add(1, std::memory_order_relaxed); }

void quantize_superblock_activations(const float* x, int64_t cols, int64_t token_begin, int64_t token_end,
                                     const SuperBlockActivations& out, const uint8_t* run_order) {
  const int64_t num_blocks = cols / 256;
  constexpr float kMagic = 12582912.0f;  // 1.5 · 2^23: the addition rounds to nearest even
  for (int64_t t = token_begin; t < token_end; ++t) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const float* xb = x + t * cols + b * 256;
      const int64_t idx = t * num_blocks + b;
      float amax = 0.0f;
      for (int i = 0; i < 256; ++i) amax = std::max(amax, std::fabs(xb[i]));
      const float inv_d = amax != 0.0f ? 127.0f / amax : 0.0f;
      int8_t q[256];
      for (int i = 0; i < 256; ++i) q[i] = static_cast<int8_t>(static_cast<int32_t>((xb[i] * inv_d + kMagic) - kMagic));
      out.scales[idx] = amax / 127.0f;
      for (int s = 0; s < 16; ++s) {
        int32_t sum = 0;
        for (int i = 0; i < 16; ++i) sum += q[16 * s + i];
        out.bsums[idx * 16 + s] = static_cast<int16_t>(sum);
      }
      int8_t* stored = out.qs + idx * 256;
      if (run_order == nullptr) {
        std::memcpy(stored, q, 256);
      } else {
        for (int r = 0; r < 16; ++r) std::memcpy(stored + 16 * r, q + 16 * run_order[r], 16);
      }
    }
  }
}

SuperBlockActivations ActivationBuffer::super_view(int64_t num_tokens, int64_t num_blocks) {
  const int64_t num = num_tokens * num_blocks;
  uint8_t* p = reserve(num * SuperBlockActivations::bytes_per_token(1));
  SuperBlockActivations a;
  a.num_tokens = num_tokens;
  a.num_blocks = num_blocks;
  a.qs = reinterpret_cast<int8_t*>(p);
  a.bsums = reinterpret_cast<int16_t*>(p + num * 256);
  a.scales = reinterpret_cast<float*>(p + num * (256 + 32));
  return a;
}

uint8_t* ActivationBuffer::reserve(int64_t bytes) {
  constexpr int64_t kAlign = 64;
  if (bytes + kAlign > capacity_) {
    capacity_ = std::max(bytes + kAlign, capacity_ * 2);
    storage_ = std::make_unique<uint8_t[]>(static_cast<size_t>(capacity_));
  }
  const uintptr_t base = reinterpret_cast<uintptr_t>(storage_.get());
  return reinterpret_cast<uint8_t*>((base + kAlign - 1) & ~uintptr_t{kAlign - 1});
}

QuantizedActivations ActivationBuffer::view(int64_t num_tokens, int64_t num_blocks) {
  // qs and bias take multiples of 32 bytes, so all three arrays start 32-byte aligned.
  const int64_t num = num_tokens * num_blocks;
  uint8_t* p = reserve(num * QuantizedActivations::bytes_per_token(1));
  QuantizedActivations q;
  q.num_tokens = num_tokens;
  q.num_blocks = num_blocks;
  q.qs = reinterpret_cast<int8_t*>(p);
  q.bias = reinterpret_cast<int32_t*>(p + num * 32);
  q.scales = reinterpret_cast<float*>(p + num * (32 + 32));
  q.sums = reinterpret_cast<int32_t*>(p + num * (32 + 32 + 4));
  return q;
}

Bf16TokenGroups ActivationBuffer::bf16_view(int64_t num_groups, int64_t num_tokens, int64_t num_chunks) {
  Bf16TokenGroups g;
  g.num_groups = num_groups;
  g.num_tokens = num_tokens;
  g.num_chunks = num_chunks;
  g.qs = reinterpret_cast<uint16_t*>(reserve(num_groups * num_chunks * 1024));
  return g;
}

TokenGroupActivations ActivationBuffer::group_view(int64_t num_groups, int64_t num_tokens, int64_t num_blocks) {
  constexpr int64_t kTokens = TokenGroupActivations::kTokens;
  const int64_t num = num_groups * num_blocks;
  uint8_t* p = reserve(num * kTokens * TokenGroupActivations::bytes_per_token(1));
  TokenGroupActivations g;
  g.num_groups = num_groups;
  g.num_tokens = num_tokens;
  g.num_blocks = num_blocks;
  g.qs = reinterpret_cast<int8_t*>(p);
  g.scales = reinterpret_cast<float*>(p + num * kTokens * 32);
  g.sums = reinterpret_cast<int32_t*>(p + num * kTokens * (32 + 4));
  g.half_sums = reinterpret_cast<int32_t*>(p + num * kTokens * (32 + 4 + 4));
  return g;
}

void interleave_token_groups(const QuantizedActivations& xq, int64_t group_begin, int64_t group_end,
                             const TokenGroupActivations& out) {
  constexpr int64_t kTokens = TokenGroupActivations::kTokens;
  const int64_t num_blocks = xq.num_blocks;
  for (int64_t g = group_begin; g < group_end; ++g) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const int64_t group_block = g * num_blocks + b;
      for (int64_t i = 0; i < kTokens; ++i) {
        const bool valid = g * kTokens + i < out.num_tokens;
        const int64_t token_block = (g * kTokens + i) * num_blocks + b;
        int32_t sum = 0;
        for (int lane = 0; lane < 8; ++lane) {
          int8_t four[4] = {0, 0, 0, 0};
          if (valid) std::memcpy(four, xq.qs + token_block * 32 + lane * 4, 4);
          sum += four[0] + four[1] + four[2] + four[3];
          std::memcpy(out.qs + (group_block * 8 + lane) * kTokens * 4 + i * 4, four, 4);
          if (lane == 3) out.half_sums[group_block * kTokens + i] = sum;
        }
        out.scales[group_block * kTokens + i] = valid ? xq.scales[token_block] : 0.0f;
        out.sums[group_block * kTokens + i] = sum;
      }
    }
  }
}

int64_t avx2_panel_min_tokens(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0:
    case GgmlType::kIQ4_XS:
      return 12;
    case GgmlType::kQ6_K:
      return 10;
    default:
      return 8;
  }
}

bool avx2_panels_take_batch(Isa isa, GgmlType type, int64_t num_tokens) {
  return isa == Isa::kAvx2 && avx2_panels_support(type) && num_tokens >= avx2_panel_min_tokens(type);
}

bool amx_takes_batch(Isa isa, GgmlType type, int64_t num_tokens) {
  return isa == Isa::kAmx && is_classic_quantized(type) && num_tokens >= kAmxMinTokens;
}

// Measured (2 threads, Zen 5, weights cold as in a model, medians of 5-7 interleaved rounds),
// group kernel / row kernel time: Q4_K 2048² 1.91x at 4 tokens, 1.11x at 8, 0.91x at 9, 0.80x
// at 10, 0.77x at 12; 8192 x 2048 0.97x at 8, 0.80x at 9; Q6_K 1.06x / 0.97x at 8, 0.91x /
// 0.84x at 9. The row kernel tiles 4 tokens, so 8 is its best case.
int64_t avx512_super_group_min_tokens() { return 9; }

bool avx512_super_groups_take_batch(Isa isa, GgmlType type, int64_t num_tokens) {
  return (isa == Isa::kAvx512 || isa == Isa::kAmx) && activation_format(type) == ActivationFormat::kSuperBlocks &&
         num_tokens >= avx512_super_group_min_tokens();
}

int64_t token_groups_for_batch(Isa isa, GgmlType type, int64_t num_tokens) {
  if (avx512_super_groups_take_batch(isa, type, num_tokens)) {
    return (num_tokens + TokenGroupActivations::kTokens - 1) / TokenGroupActivations::kTokens;
  }
  if ((isa != Isa::kAvx512 && isa != Isa::kAmx) || !is_classic_quantized(type)) return 0;
  // A remainder is a padded group once the row kernel would cost more. Measured (2048², 2
  // threads, Zen 5, medians of 5 interleaved): Q8_0 rows take 200 us at 4 tokens and 362 at
  // 8, a group ~300 whatever its fill, so from 7 tokens; Q4_0 rows 250 us at 8 against 328 for
  // a group, so from 9, as on the AMX kernel's remainders.
  const int64_t min_padded_group = isa == Isa::kAvx512 && type == GgmlType::kQ8_0 ? 7 : 9;
  const int64_t full = num_tokens / TokenGroupActivations::kTokens;
  return full + (num_tokens % TokenGroupActivations::kTokens >= min_padded_group ? 1 : 0);
}

int32_t activation_bias_offset(Isa isa, GgmlType type) {
  if (type == GgmlType::kQ4_0) return 8;
  if (type == GgmlType::kQ8_0 && (isa == Isa::kAvx512 || isa == Isa::kAmx)) return 128;
  return 0;  // portable multiplies signed values; AVX2 moves Q8_0 signs onto the activations
}

void matmul_with_isa(Isa isa, const WeightMatrix& w, const float* x, float* y, int64_t num_tokens, ThreadPool& pool) {
  const MatmulOutput out{&w, y};
  matmul_shared_input_with_isa(isa, std::span(&out, 1), x, num_tokens, pool);
}

void matmul_shared_input_with_isa(Isa isa, std::span<const MatmulOutput> outs, const float* x, int64_t num_tokens,
                                  ThreadPool& pool) {
  KVLM_CHECK(!outs.empty(), "matmul: no weight matrix");
  for (const MatmulOutput& out : outs) {
    KVLM_CHECK(out.w != nullptr, "matmul: a null weight matrix");
    check_weight(*out.w);
    KVLM_CHECK(out.w->type == outs[0].w->type && out.w->cols == outs[0].w->cols,
               "matmul over one input: matrices of {} x {} and {} x {} differ in type or width",
               ggml_type_name(outs[0].w->type), outs[0].w->cols, ggml_type_name(out.w->type), out.w->cols);
    KVLM_CHECK(out.y != nullptr, "matmul: y=nullptr");
  }
  KVLM_CHECK(isa_supported(isa), "matmul ISA {} is not supported by this CPU", isa_name(isa));
  KVLM_CHECK(x != nullptr && num_tokens >= 0, "matmul: x={} num_tokens={}", static_cast<const void*>(x), num_tokens);
  if (num_tokens == 0) return;

  // Everything up to the split over rows depends on the type and width only, which the
  // matrices share; w stands for all of them there.
  const WeightMatrix& w = *outs[0].w;
  MatmulProblem problem;
  problem.x = x;
  int64_t bytes_per_token = w.cols * static_cast<int64_t>(sizeof(float));
  QuantizedActivations xq;
  Q4PairActivations x4;
  SuperBlockActivations xk;
  TokenGroupActivations xg;
  int64_t num_groups = 0;  // groups of 16 tokens for the token-group kernel
  Bf16TokenGroups xb;
  const bool amx = amx_takes_batch(isa, w.type, num_tokens);
  const bool panels = avx2_panels_take_batch(isa, w.type, num_tokens);
  const bool super_groups = avx512_super_groups_take_batch(isa, w.type, num_tokens);
  // The panel kernel and the super-block group kernel take 32-element activation blocks for
  // every type but the panels' K-quants, whose integer sub-block scales need one activation
  // scale per super-block.
  const ActivationFormat format = panels && avx2_super_panels_support(w.type) ? ActivationFormat::kSuperBlocks
                                  : panels || super_groups                    ? ActivationFormat::kBlocks32
                                                                              : activation_format(w.type);
  if (amx) {  // the groups as bf16; only the tokens past them are quantized, for the row kernel
    num_groups = token_groups_for_batch(isa, w.type, num_tokens);
    xb = scratch_token_groups().bf16_view(num_groups, num_tokens, w.cols / 32);
    pool.parallel_for(num_groups, 1,
                      [&](int64_t begin, int64_t end) { convert_bf16_token_groups(x, w.cols, begin, end, xb); });
    problem.xb = &xb;
  }
  // AMX groups take bf16 activations: only the tokens past them need int8 ones.
  const int64_t first_quantized = std::min(num_tokens, num_groups * TokenGroupActivations::kTokens);
  if (format == ActivationFormat::kBlocks32) {
    const int64_t num_blocks = w.cols / 32;
    xq = scratch_activations().view(num_tokens, num_blocks);
    const int32_t offset = is_classic_quantized(w.type) ? activation_bias_offset(isa, w.type) : 0;
    const QuantizeActivationsFn quantize = quantize_fn(isa);
    const bool sums = needs_block_sums(w.type);
    const int64_t min_tokens = std::max<int64_t>(1, 4096 / w.cols);
    // The AVX2 Q8_0 panels multiply int16 pairs: the values widened once for every thread.
    int16_t* x16 = nullptr;
    if (panels && w.type == GgmlType::kQ8_0) {
      x16 = reinterpret_cast<int16_t*>(scratch_regrouped_activations().reserve(num_tokens * w.cols * 2));
      problem.x16 = x16;
    }
    // The AVX2 Q4_0 row kernel unpacks two weight blocks at once: the activations in pairs.
    if (isa == Isa::kAvx2 && w.type == GgmlType::kQ4_0 && !panels) {
      x4.num_pairs = num_blocks / 2;
      uint8_t* bytes = scratch_regrouped_activations().reserve(
          std::max<int64_t>(1, num_tokens * Q4PairActivations::bytes_per_token(x4.num_pairs)));
      x4.qs = reinterpret_cast<int8_t*>(bytes);
      x4.bias = reinterpret_cast<int32_t*>(bytes + num_tokens * x4.num_pairs * 64);
      problem.x4 = &x4;
    }
    pool.parallel_for(num_tokens - first_quantized, min_tokens, [&](int64_t begin, int64_t end) {
      begin += first_quantized;
      end += first_quantized;
      quantize(x, w.cols, begin, end, offset, xq);
      if (x16 != nullptr) widen_activations_avx2(xq, begin, end, x16);
      if (problem.x4 != nullptr) pair_q4_activations(xq, begin, end, x4);
      for (int64_t i = begin * num_blocks; sums && i < end * num_blocks; ++i) {
        int32_t sum = 0;
        for (int k = 0; k < 32; ++k) sum += xq.qs[i * 32 + k];
        xq.sums[i] = sum;
      }
    });
    problem.xq = &xq;
    bytes_per_token = QuantizedActivations::bytes_per_token(num_blocks);
    if (!amx) num_groups = token_groups_for_batch(isa, w.type, num_tokens);
    if (num_groups > 0 && !amx) {
      xg = scratch_token_groups().group_view(num_groups, num_tokens, num_blocks);
      pool.parallel_for(num_groups, 1,
                        [&](int64_t begin, int64_t end) { interleave_token_groups(xq, begin, end, xg); });
      problem.xg = &xg;
    }
  } else if (format == ActivationFormat::kSuperBlocks) {
    const int64_t num_blocks = w.cols / 256;
    xk = scratch_activations().super_view(num_tokens, num_blocks);
    const uint8_t* run_order =
        isa == Isa::kAvx512 || isa == Isa::kAmx ? avx512_super_activation_order(w.type) : nullptr;
    pool.parallel_for(num_tokens, std::max<int64_t>(1, 4096 / w.cols), [&](int64_t begin, int64_t end) {
      if (isa == Isa::kPortable) {
        quantize_superblock_activations(x, w.cols, begin, end, xk, run_order);
      } else {
        quantize_superblock_activations_avx2(x, w.cols, begin, end, xk, run_order);
      }
    });
    problem.xk = &xk;
    bytes_per_token = SuperBlockActivations::bytes_per_token(num_blocks);
  }

  // The panel kernel stages each block of weight rows once and runs every token over it.
  const int64_t tokens_per_chunk =
      panels ? num_tokens : std::max<int64_t>(8, kActivationBytesPerChunk / bytes_per_token / 8 * 8);
  // The AMX kernel stages each block of weight rows once and runs every group over it; the
  // AVX-512 one takes as many groups at a time as stay in L2 beside the rows.
  int64_t groups_per_chunk = std::max<int64_t>(1, num_groups);
  if (num_groups > 0 && !amx) {
    const int64_t group_bytes = TokenGroupActivations::kTokens * TokenGroupActivations::bytes_per_token(w.cols / 32);
    groups_per_chunk = std::max<int64_t>(1, kActivationBytesPerChunk / group_bytes);
  }
  const int64_t first_ungrouped = std::min(num_tokens, num_groups * TokenGroupActivations::kTokens);
  // The AMX kernel works on 16-row panels: a thread's rows start at a multiple of 16.
  const int64_t row_group = amx ? kAmxRowGroup : panels ? kPanelRowGroup : kRowGroup;
  // The matrices' row groups, numbered one after another: matrix m holds [first_group[m], first_group[m + 1]).
  std::vector<int64_t> first_group{0};
  for (const MatmulOutput& out : outs) first_group.push_back(first_group.back() + (out.w->rows + row_group - 1) / row_group);
  const int64_t macs_per_row_group = row_group * w.cols * num_tokens;
  const int64_t min_row_groups = std::max<int64_t>(1, (kMinMacsPerChunk + macs_per_row_group - 1) / macs_per_row_group);
  const MatmulRowsFn rows = panels ? matmul_panels_avx2
                            : format == ActivationFormat::kNone || is_classic_quantized(w.type)
                                ? rows_fn(isa)
                                : decoded_rows_fn(isa, format);
  const MatmulRowsFn groups = num_groups == 0 ? nullptr
                              : amx          ? matmul_token_groups_amx
                              : super_groups ? matmul_super_token_groups_avx512
                                             : matmul_token_groups_avx512;
  // The row kernels of the super-block types take 256-element activation blocks: none of
  // their tokens may be left past the groups.
  KVLM_CHECK(!super_groups || first_ungrouped == num_tokens, "super-block batch of {} tokens left {} ungrouped",
             num_tokens, num_tokens - first_ungrouped);
  // Rows go out in tapering chunks: equal chunks left one thread idle at the end of each
  // matmul (long batches: 6% of an AVX2 pp512 profile; decode, whose two threads stream at
  // different speeds: 5% of its samples in ThreadPool::run). A row's result does not depend on
  // the split.
  // One pass over every matrix's rows: a chunk that crosses from one matrix into the next runs
  // its part of each.
  pool.parallel_for_tapered(first_group.back(), min_row_groups, [&](int64_t begin, int64_t end) {
    for (size_t m = 0; m < outs.size(); ++m) {
      const int64_t local_begin = std::max(begin, first_group[m]) - first_group[m];
      const int64_t local_end = std::min(end, first_group[m + 1]) - first_group[m];
      if (local_begin >= local_end) continue;
      const int64_t row_begin = local_begin * row_group;
      const int64_t row_end = std::min(outs[m].w->rows, local_end * row_group);
      MatmulProblem chunk = problem;
      chunk.w = outs[m].w;
      chunk.y = outs[m].y;
      for (int64_t g = 0; g < num_groups; g += groups_per_chunk) {
        chunk.group_begin = g;
        chunk.group_end = std::min(num_groups, g + groups_per_chunk);
        groups(chunk, row_begin, row_end);
      }
      for (int64_t t = first_ungrouped; t < num_tokens; t += tokens_per_chunk) {
        chunk.token_begin = t;
        chunk.token_end = std::min(num_tokens, t + tokens_per_chunk);
        rows(chunk, row_begin, row_end);
      }
    }
  });
}

}  // namespace ops_internal

void matmul(const WeightMatrix& w, const float* x, float* y, int64_t num_tokens, ThreadPool& pool) {
  ops_internal::matmul_with_isa(ops_internal::best_isa(), w, x, y, num_tokens, pool);
}

void matmul_shared_input(std::span<const MatmulOutput> outs, const float* x, int64_t num_tokens, ThreadPool& pool) {
  // Runs of consecutive matrices of one type and width go together.
  size_t begin = 0;
  while (begin < outs.size()) {
    size_t end = begin + 1;
    while (end < outs.size() && outs[end].w != nullptr && outs[begin].w != nullptr &&
           outs[end].w->type == outs[begin].w->type && outs[end].w->cols == outs[begin].w->cols) {
      ++end;
    }
    ops_internal::matmul_shared_input_with_isa(ops_internal::best_isa(), outs.subspan(begin, end - begin), x,
                                               num_tokens, pool);
    begin = end;
  }
}

void dequantize_weight_row(const WeightMatrix& w, int64_t row, float* dst) {
  ops_internal::check_weight(w);
  KVLM_CHECK(row >= 0 && row < w.rows, "row {} out of range [0, {})", row, w.rows);
  dequantize_row_reference(w.type, w.data + static_cast<uint64_t>(row) * w.row_bytes, dst, w.cols);
}

}  // namespace kvlm
