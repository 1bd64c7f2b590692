// ServerMetrics: request latencies and outcomes, and /metrics in Prometheus text format
// (names follow vLLM's, prefix "kvlm:", so existing dashboards apply).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine_metrics.h"
#include "engine/request.h"

namespace kvlm::server {

// A cumulative histogram with fixed upper bounds (Prometheus "le" buckets, +Inf implied).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  const std::vector<double>& bounds() const { return bounds_; }
  const std::vector<uint64_t>& counts() const { return counts_; }  // per bucket, not cumulative; last = +Inf
  double sum() const { return sum_; }
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

// What the engine's counters do not know: per-request outcomes seen by the HTTP layer.
struct RequestOutcome {
  FinishReason finish = FinishReason::kNone;
  const RequestStats* stats = nullptr;   // null when the request never reached the engine
  EvictionPolicy policy = EvictionPolicy::kNone;
};

// The labels every KV series carries.
struct MetricsLabels {
  std::string model_name;
  std::string k_codec;
  std::string v_codec;
};

class ServerMetrics {
 public:
  ServerMetrics();
  void record(const RequestOutcome& outcome);  // thread-safe
  void record_http_status(int status);         // thread-safe

  // The Prometheus text exposition of the server's and the engine's series.
  std::string prometheus_text(const EngineMetrics& engine, const MetricsLabels& labels) const;

 private:
  mutable std::mutex mutex_;
  Histogram time_to_first_token_;
  Histogram inter_token_latency_;
  Histogram e2e_request_latency_;
  std::map<std::string, int64_t> success_by_reason_;   // stop, length, abort, error
  std::map<std::string, int64_t> evicted_by_policy_;   // tokens evicted, by policy name
  std::map<int, int64_t> http_by_status_;
};

}  // namespace kvlm::server
