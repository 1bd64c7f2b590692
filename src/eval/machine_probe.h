// Machine probes: the memory bandwidth and matrix throughput this machine delivers, measured
// (`kvlm bench --probe`, and the roofline column of every `kvlm bench` table).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"

namespace kvlm {

// STREAM's triad, a[i] = b[i] + s·c[i] over three arrays of doubles far larger than the caches,
// split over the pool's threads (each writes the part it first touched). Counted as STREAM
// counts it: 24 bytes per element (two reads, one write; the write-allocate read is not
// counted).
// Decode only reads (weights and KV), so a read-only pass over two of the arrays is measured as
// well: where stores cost more than loads (a write-allocate read per stored line, which the
// triad's count leaves out) it is the higher ceiling, and a decode past 100% of the triad is
// still below it. Which is higher depends on the machine: on Zen 5 (2 threads) the two are
// within noise of each other (triad 47.7-51.3, read 47.9-50.6 GB/s).
struct BandwidthProbe {
  double median_gb_s = 0;  // triad, median of the repetitions: what the % BW columns divide by
  double best_gb_s = 0;    // STREAM's own figure
  std::vector<double> samples_gb_s;
  double read_median_gb_s = 0;  // the read-only pass: what the % read columns divide by
  double read_best_gb_s = 0;
  std::vector<double> read_samples_gb_s;
  uint64_t array_bytes = 0;  // each of the three arrays
  int threads = 0;
};

// The engine's prefill matmul at a compute-bound shape: Q8_0 weights (rows × cols, small enough
// to stay in cache) times `tokens` activation rows, 2 · rows · cols · tokens operations a call.
struct MatmulProbe {
  double median_gops = 0;
  double best_gops = 0;
  std::vector<double> samples_gops;
  int64_t rows = 0, cols = 0, tokens = 0;
  int threads = 0;
};

struct MachineProbeOptions {
  // Bytes of each triad array; 0: 2 × the last-level cache sysconf reports, within [128, 256] MiB.
  uint64_t array_bytes = 0;
  int reps = 5;
  static constexpr uint64_t kMaxArrayBytes = uint64_t{8} << 30;
};

// Errors: reps outside [1, 1000], arrays below 1 MiB or above kMaxArrayBytes, or memory that
// cannot be had.
Result<BandwidthProbe> probe_bandwidth(ThreadPool& pool, const MachineProbeOptions& options = {});
Result<MatmulProbe> probe_matmul(ThreadPool& pool, int reps = 5);

// "triad 22.8 GB/s (best 23.4), read 30.1 GB/s (best 31.0) on 2 threads, 3 x 128 MiB"; "Q8_0 matmul 412 GOPS on 2 threads".
std::string describe(const BandwidthProbe& probe);
std::string describe(const MatmulProbe& probe);

}  // namespace kvlm
