#include "eval/machine_probe.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <memory>
#include <new>

#include <fmt/format.h>

#include "core/quantize.h"
#include "core/rng.h"
#include "eval/sample_stats.h"
#include "ops/matmul.h"

namespace kvlm {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Twice the last-level cache sysconf reports, within [128 MiB, 256 MiB]: a VM's cores can fill
// only their own part of a large server L3 (sysconf reports the whole), and 3 × 256 MiB already
// dwarfs any single CCD's or socket slice's cache while keeping the probe under a second.
uint64_t default_array_bytes() {
  const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  const uint64_t twice = llc > 0 ? 2 * static_cast<uint64_t>(llc) : 0;
  return std::clamp<uint64_t>(twice, uint64_t{128} << 20, uint64_t{256} << 20);
}

// GB/s of each of `reps` timed runs of `pass`, which moves `bytes` per run, after one untimed
// warm-up run: page faults and frequency ramp are not bandwidth.
template <class Pass>
std::vector<double> timed_gb_s(int reps, double bytes, const Pass& pass) {
  pass();
  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    pass();
    samples.push_back(bytes / seconds_since(start) / 1e9);
  }
  return samples;
}

struct FreeDoubles {
  void operator()(double* p) const { ::operator delete[](p, std::align_val_t{64}); }
};
using Doubles = std::unique_ptr<double[], FreeDoubles>;

}  // namespace

Result<BandwidthProbe> probe_bandwidth(ThreadPool& pool, const MachineProbeOptions& options) {
  if (options.reps < 1 || options.reps > 1000) return Status::errorf("probe repetitions {} not in [1, 1000]", options.reps);
  const uint64_t bytes = options.array_bytes > 0 ? options.array_bytes : default_array_bytes();
  if (bytes < (uint64_t{1} << 20) || bytes > MachineProbeOptions::kMaxArrayBytes) {
    return Status::errorf("probe arrays of {} bytes: each must be 1 MiB to {} GiB", bytes,
                          MachineProbeOptions::kMaxArrayBytes >> 30);
  }
  const int64_t n = static_cast<int64_t>(bytes / sizeof(double));
  Doubles a, b, c;
  for (Doubles* d : {&a, &b, &c}) {
    d->reset(static_cast<double*>(::operator new[](n * sizeof(double), std::align_val_t{64}, std::nothrow)));
    if (!*d) return Status::errorf("bandwidth probe: out of memory for 3 arrays of {} MiB", bytes >> 20);
  }
  // Each thread first touches the part it will stream, so pages sit on its memory node.
  const int64_t grain = std::max<int64_t>(1, n / (64 * std::max(1, pool.num_threads())));
  pool.parallel_for(n, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      a[i] = 0.0;
      b[i] = 1.0;
      c[i] = 2.0;
    }
  });
  const double scalar = 3.0;
  auto triad = [&] {
    pool.parallel_for(n, grain, [&](int64_t begin, int64_t end) {
      double* __restrict x = a.get();
      const double* __restrict y = b.get();
      const double* __restrict z = c.get();
      for (int64_t i = begin; i < end; ++i) x[i] = y[i] + scalar * z[i];
    });
  };
  BandwidthProbe probe;
  probe.array_bytes = static_cast<uint64_t>(n) * sizeof(double);
  probe.threads = pool.num_threads();
  probe.samples_gb_s = timed_gb_s(options.reps, 3.0 * static_cast<double>(probe.array_bytes), triad);
  // The result is read back, so the stores cannot be elided.
  if (!(a[n / 2] == 7.0)) return Status::errorf("bandwidth probe: triad computed {} instead of 7", a[n / 2]);
  probe.median_gb_s = median_of(probe.samples_gb_s);
  probe.best_gb_s = *std::max_element(probe.samples_gb_s.begin(), probe.samples_gb_s.end());

  // Reads b and c whole. The words are summed as integers, whose addition the compiler may
  // reorder into vector lanes (a double sum it may not), and the total is checked, so the
  // loads cannot be elided: n · (bits(1.0) + bits(2.0)) modulo 2^64.
  std::atomic<uint64_t> total{0};
  auto read_pass = [&] {
    total = 0;
    pool.parallel_for(n, grain, [&](int64_t begin, int64_t end) {
      const uint64_t* __restrict y = reinterpret_cast<const uint64_t*>(b.get());
      const uint64_t* __restrict z = reinterpret_cast<const uint64_t*>(c.get());
      uint64_t sum = 0;
      for (int64_t i = begin; i < end; ++i) sum += y[i] + z[i];
      total.fetch_add(sum, std::memory_order_relaxed);
    });
  };
  probe.read_samples_gb_s = timed_gb_s(options.reps, 2.0 * static_cast<double>(probe.array_bytes), read_pass);
  const uint64_t expected =
      static_cast<uint64_t>(n) * (std::bit_cast<uint64_t>(1.0) + std::bit_cast<uint64_t>(2.0));
  if (total.load() != expected) {
    return Status::errorf("bandwidth probe: the read pass summed {} instead of {}", total.load(), expected);
  }
  probe.read_median_gb_s = median_of(probe.read_samples_gb_s);
  probe.read_best_gb_s = *std::max_element(probe.read_samples_gb_s.begin(), probe.read_samples_gb_s.end());
  return probe;
}

Result<MatmulProbe> probe_matmul(ThreadPool& pool, int reps) {
  if (reps < 1 || reps > 1000) return Status::errorf("probe repetitions {} not in [1, 1000]", reps);
  MatmulProbe probe;
  probe.rows = 2048;
  probe.cols = 2048;
  probe.tokens = 128;
  probe.threads = pool.num_threads();
  const uint64_t row_bytes = ggml_row_bytes(GgmlType::kQ8_0, probe.cols);
  std::vector<uint8_t> weights(row_bytes * static_cast<uint64_t>(probe.rows));
  Rng rng(7);
  std::vector<float> row(static_cast<size_t>(probe.cols));
  for (int64_t r = 0; r < probe.rows; ++r) {
    for (float& v : row) v = static_cast<float>(rng.next_double() - 0.5);
    quantize_row_reference(GgmlType::kQ8_0, row.data(), weights.data() + r * row_bytes, probe.cols);
  }
  const WeightMatrix w{GgmlType::kQ8_0, weights.data(), probe.rows, probe.cols, row_bytes};
  std::vector<float> x(static_cast<size_t>(probe.tokens * probe.cols));
  for (float& v : x) v = static_cast<float>(rng.next_double() - 0.5);
  std::vector<float> y(static_cast<size_t>(probe.tokens * probe.rows));
  matmul(w, x.data(), y.data(), probe.tokens, pool);  // warm-up
  const double ops = 2.0 * static_cast<double>(probe.rows) * static_cast<double>(probe.cols) *
                     static_cast<double>(probe.tokens);
  for (int r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    matmul(w, x.data(), y.data(), probe.tokens, pool);
    probe.samples_gops.push_back(ops / seconds_since(start) / 1e9);
  }
  if (!std::isfinite(y[0])) return Status::error("matmul probe: the product is not finite");
  probe.median_gops = median_of(probe.samples_gops);
  probe.best_gops = *std::max_element(probe.samples_gops.begin(), probe.samples_gops.end());
  return probe;
}

std::string describe(const BandwidthProbe& p) {
  return fmt::format("triad {:.1f} GB/s (best {:.1f}), read {:.1f} GB/s (best {:.1f}) on {} thread{}, 3 x {} MiB",
                     p.median_gb_s, p.best_gb_s, p.read_median_gb_s, p.read_best_gb_s, p.threads,
                     p.threads == 1 ? "" : "s", p.array_bytes >> 20);
}

std::string describe(const MatmulProbe& p) {
  return fmt::format("Q8_0 matmul {:.0f} GOPS (best {:.0f}) on {} thread{}, {} x {} weights x {} tokens",
                     p.median_gops, p.best_gops, p.threads, p.threads == 1 ? "" : "s", p.rows, p.cols, p.tokens);
}

}  // namespace kvlm
