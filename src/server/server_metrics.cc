#include "server/server_metrics.h"

#include <algorithm>

#include <fmt/format.h>

namespace kvlm::server {
namespace {

// vLLM's bucket bounds (seconds), so the same dashboard panels read the same.
std::vector<double> ttft_bounds() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
}
std::vector<double> itl_bounds() {
  return {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
}
std::vector<double> e2e_bounds() {
  return {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0};
}

std::string escape_label(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

// Prometheus writes +Inf, and integral values without a fraction.
std::string number(double v) { return fmt::format("{}", v); }

class Exposition {
 public:
  explicit Exposition(std::string base_labels) : base_(std::move(base_labels)) {}

  void header(const std::string& name, const char* type, const char* help) {
    out_ += fmt::format("# HELP kvlm:{} {}\n# TYPE kvlm:{} {}\n", name, help, name, type);
  }
  void sample(const std::string& name, double value, const std::string& extra_labels = {}) {
    std::string labels = base_;
    if (!extra_labels.empty()) labels += "," + extra_labels;
    out_ += fmt::format("kvlm:{}{{{}}} {}\n", name, labels, number(value));
  }
  void metric(const std::string& name, const char* type, const char* help, double value) {
    header(name, type, help);
    sample(name, value);
  }
  void histogram(const std::string& name, const char* help, const Histogram& h) {
    header(name, "histogram", help);
    uint64_t cumulative = 0;
    for (size_t i = 0; i < h.bounds().size(); ++i) {
      cumulative += h.counts()[i];
      sample(name + "_bucket", static_cast<double>(cumulative), fmt::format("le=\"{}\"", number(h.bounds()[i])));
    }
    cumulative += h.counts().back();
    sample(name + "_bucket", static_cast<double>(cumulative), "le=\"+Inf\"");
    sample(name + "_sum", h.sum());
    sample(name + "_count", static_cast<double>(h.count()));
  }
  std::string take() { return std::move(out_); }

 private:
  std::string base_;
  std::string out_;
};

const char* outcome_label(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "abort";  // vLLM's name for a cancelled request
    case FinishReason::kError: return "error";
    case FinishReason::kNone: break;
  }
  return "error";
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

ServerMetrics::ServerMetrics()
    : time_to_first_token_(ttft_bounds()), inter_token_latency_(itl_bounds()), e2e_request_latency_(e2e_bounds()) {
  for (const char* reason : {"stop", "length", "abort", "error"}) success_by_reason_[reason] = 0;
}

void ServerMetrics::record(const RequestOutcome& outcome) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++success_by_reason_[outcome_label(outcome.finish)];
  if (outcome.stats == nullptr) return;
  const RequestStats& s = *outcome.stats;
  if (s.completion_tokens > 0) time_to_first_token_.observe(s.time_to_first_token);
  for (double gap : s.inter_token) inter_token_latency_.observe(gap);
  e2e_request_latency_.observe(s.total_seconds);
  if (outcome.policy != EvictionPolicy::kNone) {
    evicted_by_policy_[std::string(eviction_policy_name(outcome.policy))] += s.eviction.tokens_evicted;
  }
}

void ServerMetrics::record_http_status(int status) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++http_by_status_[status];
}

std::string ServerMetrics::prometheus_text(const EngineMetrics& e, const MetricsLabels& labels) const {
  Exposition x(fmt::format("model_name=\"{}\"", escape_label(labels.model_name)));
  x.metric("num_requests_running", "gauge", "Requests in the running batch.", e.requests_running);
  x.metric("num_requests_waiting", "gauge", "Requests waiting for admission (queued or preempted).", e.requests_waiting);
  const double usage = e.blocks_total > 0 ? static_cast<double>(e.blocks_used) / e.blocks_total : 0.0;
  x.metric("kv_cache_usage_ratio", "gauge", "Fraction of KV blocks held by requests (1 = full).", usage);

  const std::string codec = fmt::format("k_codec=\"{}\",v_codec=\"{}\"", escape_label(labels.k_codec),
                                        escape_label(labels.v_codec));
  x.header("kv_cache_blocks", "gauge", "KV blocks by state: used (held by requests), cached_free (reusable by a prefix hit), free.");
  x.sample("kv_cache_blocks", e.blocks_used, codec + ",state=\"used\"");
  x.sample("kv_cache_blocks", e.blocks_cached_free, codec + ",state=\"cached_free\"");
  x.sample("kv_cache_blocks", e.blocks_free, codec + ",state=\"free\"");
  x.header("kv_cache_bytes", "gauge", "KV bytes by state (blocks x bytes per block, every layer).");
  const double bpb = static_cast<double>(e.bytes_per_block);
  x.sample("kv_cache_bytes", e.blocks_used * bpb, codec + ",state=\"used\"");
  x.sample("kv_cache_bytes", e.blocks_cached_free * bpb, codec + ",state=\"cached_free\"");
  x.sample("kv_cache_bytes", e.blocks_free * bpb, codec + ",state=\"free\"");
  x.header("kv_cache_blocks_total", "gauge", "KV blocks in the pool.");
  x.sample("kv_cache_blocks_total", e.blocks_total, codec);
  if (e.local_slots_total > 0) {
    x.header("kv_cache_local_slots", "gauge",
             "Slots of the sliding-window layers by state: pinned (in a running window), retained (kept for a "
             "prefix hit), free.");
    const int free_slots = e.local_slots_total - e.local_slots_pinned - e.local_slots_retained;
    x.sample("kv_cache_local_slots", e.local_slots_pinned, codec + ",state=\"pinned\"");
    x.sample("kv_cache_local_slots", e.local_slots_retained, codec + ",state=\"retained\"");
    x.sample("kv_cache_local_slots", free_slots, codec + ",state=\"free\"");
    x.header("kv_cache_local_bytes", "gauge", "Bytes of the sliding-window layers' slots by state.");
    const double bps = static_cast<double>(e.local_bytes_per_slot);
    x.sample("kv_cache_local_bytes", e.local_slots_pinned * bps, codec + ",state=\"pinned\"");
    x.sample("kv_cache_local_bytes", e.local_slots_retained * bps, codec + ",state=\"retained\"");
    x.sample("kv_cache_local_bytes", free_slots * bps, codec + ",state=\"free\"");
  }
  x.header("kv_cache_staging_bytes", "gauge", "f32 staging beside the blocks (KIVI's residual window).");
  x.sample("kv_cache_staging_bytes", static_cast<double>(e.staging_bytes), codec);

  x.metric("prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
           static_cast<double>(e.prefix_queries_tokens));
  x.metric("prefix_cache_hits_total", "counter", "Prompt tokens the prefix cache supplied.",
           static_cast<double>(e.prefix_hit_tokens));
  x.metric("num_preemptions_total", "counter", "Requests preempted (blocks given back, recomputed later).",
           static_cast<double>(e.preemptions));
  x.metric("prompt_tokens_total", "counter", "Prompt tokens submitted.", static_cast<double>(e.tokens_prompted));
  x.metric("generation_tokens_total", "counter", "Tokens generated.", static_cast<double>(e.tokens_generated));
  x.metric("computed_tokens_total", "counter", "Tokens run through the model (prefill, decode and recompute).",
           static_cast<double>(e.tokens_computed));
  x.metric("engine_steps_total", "counter", "Batched forward passes.", static_cast<double>(e.steps));

  std::lock_guard<std::mutex> lock(mutex_);
  x.header("request_success_total", "counter", "Finished requests by finish reason.");
  for (const auto& [reason, count] : success_by_reason_) {
    x.sample("request_success_total", static_cast<double>(count), fmt::format("finished_reason=\"{}\"", reason));
  }
  x.header("evicted_tokens_total", "counter", "Tokens evicted from the KV cache, by eviction policy.");
  for (const char* policy : {"window", "streaming", "h2o", "snapkv"}) {
    auto it = evicted_by_policy_.find(policy);
    x.sample("evicted_tokens_total", it == evicted_by_policy_.end() ? 0.0 : static_cast<double>(it->second),
             fmt::format("policy=\"{}\"", policy));
  }
  x.header("http_requests_total", "counter", "HTTP responses by status code.");
  for (const auto& [status, count] : http_by_status_) {
    x.sample("http_requests_total", static_cast<double>(count), fmt::format("status=\"{}\"", status));
  }
  x.histogram("time_to_first_token_seconds", "Time from arrival to the first generated token.", time_to_first_token_);
  x.histogram("inter_token_latency_seconds", "Time between consecutive generated tokens.", inter_token_latency_);
  x.histogram("e2e_request_latency_seconds", "Time from arrival to the last token.", e2e_request_latency_);
  return x.take();
}

}  // namespace kvlm::server
