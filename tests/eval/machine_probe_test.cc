// The machine probes: figures that are finite and consistent, and errors for absurd sizes.
// (What the figures are is measured, never asserted: machines are shared and noisy.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "eval/machine_probe.h"

namespace kvlm {
namespace {

TEST(MachineProbe, BandwidthFiguresAreConsistent) {
  ThreadPool pool(2);
  MachineProbeOptions options;
  options.array_bytes = uint64_t{4} << 20;
  options.reps = 3;
  const auto probe = probe_bandwidth(pool, options);
  ASSERT_TRUE(probe.ok()) << probe.status().message();
  EXPECT_EQ(probe->array_bytes, uint64_t{4} << 20);
  EXPECT_EQ(probe->threads, 2);
  ASSERT_EQ(probe->samples_gb_s.size(), 3u);
  for (double s : probe->samples_gb_s) EXPECT_TRUE(std::isfinite(s) && s > 0) << s;
  EXPECT_EQ(probe->best_gb_s, *std::max_element(probe->samples_gb_s.begin(), probe->samples_gb_s.end()));
  EXPECT_LE(probe->median_gb_s, probe->best_gb_s);
  // The read-only pass over the same arrays (its sum is checked inside the probe).
  ASSERT_EQ(probe->read_samples_gb_s.size(), 3u);
  for (double s : probe->read_samples_gb_s) EXPECT_TRUE(std::isfinite(s) && s > 0) << s;
  EXPECT_EQ(probe->read_best_gb_s,
            *std::max_element(probe->read_samples_gb_s.begin(), probe->read_samples_gb_s.end()));
  EXPECT_LE(probe->read_median_gb_s, probe->read_best_gb_s);
  EXPECT_NE(describe(*probe).find(", read "), std::string::npos) << describe(*probe);
  EXPECT_NE(describe(*probe).find("on 2 threads, 3 x 4 MiB"), std::string::npos) << describe(*probe);
}

TEST(MachineProbe, MatmulFiguresAreConsistent) {
  ThreadPool pool(1);
  const auto probe = probe_matmul(pool, 2);
  ASSERT_TRUE(probe.ok()) << probe.status().message();
  ASSERT_EQ(probe->samples_gops.size(), 2u);
  EXPECT_GT(probe->median_gops, 0.0);
  EXPECT_GE(probe->best_gops, probe->median_gops);
  EXPECT_EQ(probe->rows * probe->cols, 2048 * 2048);
  EXPECT_NE(describe(*probe).find("Q8_0 matmul"), std::string::npos);
}

TEST(MachineProbe, AbsurdOptionsAreErrors) {
  ThreadPool pool(1);
  MachineProbeOptions tiny;
  tiny.array_bytes = 1024;
  const auto small = probe_bandwidth(pool, tiny);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("1 MiB to 8 GiB"), std::string::npos) << small.status().message();
  MachineProbeOptions no_reps;
  no_reps.array_bytes = uint64_t{2} << 20;
  no_reps.reps = 0;
  EXPECT_FALSE(probe_bandwidth(pool, no_reps).ok());
  EXPECT_FALSE(probe_matmul(pool, 0).ok());
}

}  // namespace
}  // namespace kvlm
