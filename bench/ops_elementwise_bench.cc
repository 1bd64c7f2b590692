// Elementwise ops at llama-3.2-1b sizes: rms_norm over the model dim, silu_mul over the FFN
// dim, softmax over an attention row, rope over all query heads of one token.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "ops/elementwise.h"

namespace kvlm {
namespace {

std::vector<float> random_vector(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

void bm_rms_norm(benchmark::State& state) {
  const int64_t n = state.range(0);
  const std::vector<float> x = random_vector(n, 1);
  const std::vector<float> weight = random_vector(n, 2);
  std::vector<float> out(n);
  for (auto _ : state) {
    rms_norm(x.data(), weight.data(), out.data(), n, 1e-5f);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(bm_rms_norm)->Arg(2048);

void bm_silu_mul(benchmark::State& state) {
  const int64_t n = state.range(0);
  const std::vector<float> gate = random_vector(n, 3);
  const std::vector<float> up = random_vector(n, 4);
  std::vector<float> out(n);
  for (auto _ : state) {
    silu_mul(gate.data(), up.data(), out.data(), n);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(bm_silu_mul)->Arg(8192);

void bm_softmax(benchmark::State& state) {
  const int64_t n = state.range(0);
  const std::vector<float> src = random_vector(n, 5);
  std::vector<float> x(n);
  for (auto _ : state) {
    x = src;
    softmax(x.data(), n);
    benchmark::DoNotOptimize(x.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(bm_softmax)->Arg(4096);

// 32 query heads of 64 dims; the position changes every call, so every call computes its
// cos/sin table (the worst case: prefill with one call per token).
void bm_rope(benchmark::State& state) {
  const RopeParams params{64, 64, 500000.0f, 1.0f, RopeStyle::kNeox};
  std::vector<float> x = random_vector(32 * 64, 6);
  Position pos = 0;
  for (auto _ : state) {
    rope_apply(params, x.data(), 32, pos++);
    benchmark::DoNotOptimize(x.data());
  }
  state.SetItemsProcessed(state.iterations() * 32 * 64);
}
BENCHMARK(bm_rope);

}  // namespace
}  // namespace kvlm
