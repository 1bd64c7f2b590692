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
// counted). Decode streams weights and KV the same way, so this is the ceiling it can reach.
struct BandwidthProbe {
  double median_gb_s = 0;  // of the repetitions: what the bench columns divide by
  double best_gb_s = 0;    // STREAM's own figure
  std::vector<double> samples_gb_s;
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

// "triad 22.8 GB/s (best 23.4) on 2 threads, 3 × 128 MiB"; "Q8_0 matmul 412 GOPS on 2 threads".
std::string describe(const BandwidthProbe& probe);
std::string describe(const MatmulProbe& probe);

}  // namespace kvlm
