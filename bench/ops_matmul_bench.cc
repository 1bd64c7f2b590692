// matmul throughput per weight type at llama-3.2-1b shapes: decode (1 token) and a 64-token
// prefill, on 1 and 2 threads, on the best ISA; and Q8_0 / Q4_0 over batch sizes 1-512 on every
// ISA this CPU has (the AMX and AVX-512 token-group kernels against each other). Weights rotate
// through copies larger than the last-level cache, so decode numbers are DRAM bandwidth as a
// real model sees it.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/quantize.h"
#include "core/thread_pool.h"
#include "ops/matmul.h"
#include "ops/matmul_kernels.h"

namespace kvlm {
namespace {

constexpr int64_t kMinFootprintBytes = int64_t{256} << 20;

// Enough copies of one random matrix that cycling through them misses every cache.
struct ColdWeights {
  std::unique_ptr<uint8_t[]> bytes;
  std::vector<WeightMatrix> copies;

  ColdWeights(GgmlType type, int64_t rows, int64_t cols) {
    const uint64_t row_bytes = ggml_row_bytes(type, cols);
    const uint64_t matrix_bytes = row_bytes * rows;
    const int64_t num_copies = std::max<int64_t>(2, (kMinFootprintBytes + matrix_bytes - 1) / matrix_bytes);
    bytes = std::make_unique<uint8_t[]>(matrix_bytes * num_copies);
    std::mt19937 rng(42);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    std::vector<float> src(cols);
    for (int64_t r = 0; r < rows; ++r) {
      for (float& v : src) v = normal(rng);
      quantize_row_reference(type, src.data(), bytes.get() + r * row_bytes, cols);
    }
    for (int64_t c = 0; c < num_copies; ++c) {
      if (c > 0) std::memcpy(bytes.get() + c * matrix_bytes, bytes.get(), matrix_bytes);
      copies.push_back(WeightMatrix{type, bytes.get() + c * matrix_bytes, rows, cols, row_bytes});
    }
  }
};

void bm_matmul(benchmark::State& state, GgmlType type, int64_t rows, int64_t cols, int64_t num_tokens, int threads,
               ops_internal::Isa isa) {
  const ColdWeights weights(type, rows, cols);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(num_tokens * cols);  // [num_tokens, cols]
  for (float& v : x) v = normal(rng);
  std::vector<float> y(num_tokens * rows);  // [num_tokens, rows]
  ThreadPool pool(threads);
  size_t next = 0;
  for (auto _ : state) {
    ops_internal::matmul_with_isa(isa, weights.copies[next], x.data(), y.data(), num_tokens, pool);
    benchmark::DoNotOptimize(y.data());
    next = (next + 1) % weights.copies.size();
  }
  const int64_t weight_bytes = static_cast<int64_t>(weights.copies[0].row_bytes) * rows;
  state.SetBytesProcessed(state.iterations() * weight_bytes);
  state.counters["GMAC/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * rows * cols * num_tokens / 1e9, benchmark::Counter::kIsRate);
}

struct Shape {
  int64_t rows, cols;
};

const bool kRegistered = [] {
  const GgmlType types[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16,   GgmlType::kQ8_0, GgmlType::kQ4_0,
                            GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,   GgmlType::kIQ4_NL, GgmlType::kQ2_K,
                            GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K,   GgmlType::kQ6_K, GgmlType::kIQ4_XS};
  for (int64_t num_tokens : {1, 64}) {
    for (Shape shape : {Shape{2048, 2048}, Shape{8192, 2048}}) {
      for (GgmlType type : types) {
        for (int threads : {1, 2}) {
          const std::string name = fmt::format("matmul/{}/{}x{}/tokens:{}/threads:{}", ggml_type_name(type), shape.rows,
                                               shape.cols, num_tokens, threads);
          benchmark::RegisterBenchmark(name.c_str(), bm_matmul, type, shape.rows, shape.cols, num_tokens, threads,
                                       ops_internal::best_isa())
              ->Unit(benchmark::kMicrosecond)
              ->UseRealTime();
        }
      }
    }
  }
  // Every ISA on the formats people download (Q8_0, Q4_0, the K-quants of Q4_K_M, F16, BF16, then
  // the other K-quants and IQ4_XS); 6 and 10 tokens place the AVX2 panel thresholds.
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_K, GgmlType::kQ6_K, GgmlType::kF16,
                        GgmlType::kBF16, GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ5_K, GgmlType::kIQ4_XS}) {
    for (int64_t num_tokens : {1, 2, 4, 6, 8, 10, 12, 16, 32, 64, 128, 512}) {
      for (ops_internal::Isa isa : ops_internal::available_isas()) {
        if (isa == ops_internal::Isa::kPortable) continue;
        const std::string name = fmt::format("matmul_isa/{}/2048x2048/tokens:{}/isa:{}/threads:2", ggml_type_name(type),
                                             num_tokens, ops_internal::isa_name(isa));
        benchmark::RegisterBenchmark(name.c_str(), bm_matmul, type, 2048, 2048, num_tokens, 2, isa)
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime();
      }
    }
  }
  // A 512-token prompt through each of a 1B model's matmul shapes (attention 2048², FFN up
  // 8192×2048, FFN down 2048×8192): the contraction length decides whether a staged panel fits L1.
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    for (Shape shape : {Shape{2048, 2048}, Shape{8192, 2048}, Shape{2048, 8192}}) {
      for (ops_internal::Isa isa : ops_internal::available_isas()) {
        if (isa == ops_internal::Isa::kPortable) continue;
        const std::string name = fmt::format("matmul_prefill/{}/{}x{}/tokens:512/isa:{}/threads:2",
                                             ggml_type_name(type), shape.rows, shape.cols, ops_internal::isa_name(isa));
        benchmark::RegisterBenchmark(name.c_str(), bm_matmul, type, shape.rows, shape.cols, 512, 2, isa)
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime();
      }
    }
  }
  return true;
}();

}  // namespace
}  // namespace kvlm
