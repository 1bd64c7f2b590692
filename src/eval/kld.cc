#include "eval/kld.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "core/check.h"

namespace kvlm {
namespace {

constexpr char kMagic[8] = {'K', 'V', 'L', 'M', 'K', 'L', 'D', '\0'};
constexpr uint32_t kVersion = 1;
constexpr size_t kCountOffset = 8 + 4 * 5;  // magic, version, vocab, ctx, storage, top_k

size_t record_bytes(const KldHeader& h) {
  const size_t payload = h.full() ? static_cast<size_t>(h.vocab) * 4 : static_cast<size_t>(kKldTopK) * 8 + 4;
  return 8 + payload;
}

template <typename T>
bool put(std::FILE* f, T value) {
  return std::fwrite(&value, sizeof(T), 1, f) == 1;
}
template <typename T>
bool get(std::FILE* f, T& value) {
  return std::fread(&value, sizeof(T), 1, f) == 1;
}

// Index of the largest value (the first one on ties).
template <typename T>
size_t argmax(std::span<const T> values) {
  return static_cast<size_t>(std::max_element(values.begin(), values.end()) - values.begin());
}

}  // namespace

KldRecord make_kld_record(std::span<const double> log_probs, TokenId target) {
  KVLM_CHECK(target >= 0 && static_cast<size_t>(target) < log_probs.size(), "target {} outside vocab {}", target,
             log_probs.size());
  KldRecord r;
  r.target = target;
  r.target_log_prob = static_cast<float>(log_probs[static_cast<size_t>(target)]);
  if (log_probs.size() <= static_cast<size_t>(kKldFullVocabMax)) {
    r.log_probs.assign(log_probs.begin(), log_probs.end());
    return r;
  }
  std::vector<int32_t> ids(log_probs.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + kKldTopK, ids.end(), [&](int32_t a, int32_t b) {
    return log_probs[static_cast<size_t>(a)] > log_probs[static_cast<size_t>(b)];
  });
  ids.resize(kKldTopK);
  double top_mass = 0;
  for (int32_t id : ids) {
    r.top_ids.push_back(id);
    r.top_log_probs.push_back(static_cast<float>(log_probs[static_cast<size_t>(id)]));
    // From the rounded value, as kl_divergence sums the current run's: self-KLD stays exactly 0.
    top_mass += std::exp(static_cast<double>(r.top_log_probs.back()));
  }
  r.rest_log_prob = static_cast<float>(std::log(std::max(1.0 - top_mass, 1e-30)));
  return r;
}

double kl_divergence(const KldRecord& base, std::span<const double> cur_log_probs) {
  double kld = 0;
  if (!base.log_probs.empty()) {
    KVLM_CHECK(base.log_probs.size() == cur_log_probs.size(), "vocab {} vs {}", base.log_probs.size(),
               cur_log_probs.size());
    for (size_t v = 0; v < cur_log_probs.size(); ++v) {
      const double lp = base.log_probs[v];
      const double lq = static_cast<float>(cur_log_probs[v]);
      kld += std::exp(lp) * (lp - lq);
    }
    return kld;
  }
  double q_top = 0;
  for (size_t i = 0; i < base.top_ids.size(); ++i) {
    const double lp = base.top_log_probs[i];
    const double lq = static_cast<float>(cur_log_probs[static_cast<size_t>(base.top_ids[i])]);
    kld += std::exp(lp) * (lp - lq);
    q_top += std::exp(lq);
  }
  const double lp_rest = base.rest_log_prob;
  const double lq_rest = static_cast<float>(std::log(std::max(1.0 - q_top, 1e-30)));
  kld += std::exp(lp_rest) * (lp_rest - lq_rest);
  return kld;
}

double kl_divergence(std::span<const double> base_log_probs, std::span<const double> cur_log_probs) {
  KVLM_CHECK(base_log_probs.size() == cur_log_probs.size(), "vocab {} vs {}", base_log_probs.size(),
             cur_log_probs.size());
  double kld = 0;
  for (size_t v = 0; v < base_log_probs.size(); ++v) {
    kld += std::exp(base_log_probs[v]) * (base_log_probs[v] - cur_log_probs[v]);
  }
  return kld;
}

double percentile(std::vector<double> values, double q) {
  KVLM_CHECK(!values.empty(), "percentile of no values");
  KVLM_CHECK(q >= 0 && q <= 1, "quantile {} outside [0, 1]", q);
  std::sort(values.begin(), values.end());
  const double pos = q * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return values[lo] + (values[hi] - values[lo]) * frac;
}

void KldAccumulator::add(double kld, double base_target_log_prob, double cur_target_log_prob, bool top1_match) {
  kld_.push_back(kld);
  base_nll_sum_ -= base_target_log_prob;
  cur_nll_sum_ -= cur_target_log_prob;
  const double dp = std::exp(cur_target_log_prob) - std::exp(base_target_log_prob);
  dp_sq_sum_ += dp * dp;
  if (top1_match) ++top1_matches_;
}

void KldAccumulator::add(const KldRecord& base, std::span<const double> cur_log_probs) {
  const size_t base_top1 = base.log_probs.empty() ? static_cast<size_t>(base.top_ids.at(0))
                                                  : argmax(std::span<const float>(base.log_probs));
  std::vector<float> rounded(cur_log_probs.begin(), cur_log_probs.end());  // [vocab]
  const size_t cur_top1 = argmax(std::span<const float>(rounded));
  add(kl_divergence(base, cur_log_probs), base.target_log_prob, rounded[static_cast<size_t>(base.target)],
      base_top1 == cur_top1);
}

KldStats KldAccumulator::finish() const {
  KldStats s;
  s.count = static_cast<int64_t>(kld_.size());
  if (kld_.empty()) return s;
  const double n = static_cast<double>(kld_.size());
  double sum = 0;
  for (double x : kld_) sum += x;
  s.mean_kld = sum / n;
  if (kld_.size() > 1) {
    double sq = 0;
    for (double x : kld_) sq += (x - s.mean_kld) * (x - s.mean_kld);
    s.kld_stderr = std::sqrt(sq / (n - 1) / n);
  }
  s.kld_p99 = percentile(kld_, 0.99);
  s.max_kld = *std::max_element(kld_.begin(), kld_.end());
  s.top1_agreement = static_cast<double>(top1_matches_) / n;
  s.rms_dp = std::sqrt(dp_sq_sum_ / n);
  s.base_ppl = std::exp(base_nll_sum_ / n);
  s.cur_ppl = std::exp(cur_nll_sum_ / n);
  s.delta_ppl = s.cur_ppl - s.base_ppl;
  return s;
}

Result<std::unique_ptr<KldWriter>> KldWriter::create(const std::string& path, const KldHeader& header) {
  std::unique_ptr<KldWriter> w(new KldWriter());
  w->path_ = path;
  w->header_ = header;
  w->file_ = std::fopen(path.c_str(), "wb");
  if (!w->file_) return Status::errorf("cannot write KLD baseline '{}': {}", path, std::strerror(errno));
  bool ok = std::fwrite(kMagic, 1, sizeof(kMagic), w->file_) == sizeof(kMagic);
  ok = ok && put<uint32_t>(w->file_, kVersion) && put<uint32_t>(w->file_, static_cast<uint32_t>(header.vocab)) &&
       put<uint32_t>(w->file_, static_cast<uint32_t>(header.ctx)) &&
       put<uint32_t>(w->file_, header.full() ? 0 : 1) && put<uint32_t>(w->file_, kKldTopK) &&
       put<uint64_t>(w->file_, 0) && put<uint64_t>(w->file_, header.model_size) &&
       put<uint32_t>(w->file_, static_cast<uint32_t>(header.model_name.size()));
  ok = ok && std::fwrite(header.model_name.data(), 1, header.model_name.size(), w->file_) == header.model_name.size();
  if (!ok) return Status::errorf("cannot write KLD baseline '{}'", path);
  return w;
}

KldWriter::~KldWriter() {
  if (file_) std::fclose(file_);
}

Status KldWriter::write(const KldRecord& r) {
  bool ok = put<int32_t>(file_, r.target) && put<float>(file_, r.target_log_prob);
  if (header_.full()) {
    KVLM_CHECK(r.log_probs.size() == static_cast<size_t>(header_.vocab), "record of {} for vocab {}",
               r.log_probs.size(), header_.vocab);
    ok = ok && std::fwrite(r.log_probs.data(), 4, r.log_probs.size(), file_) == r.log_probs.size();
  } else {
    KVLM_CHECK(r.top_ids.size() == static_cast<size_t>(kKldTopK), "top-k record of {}", r.top_ids.size());
    for (int i = 0; i < kKldTopK && ok; ++i) {
      ok = put<int32_t>(file_, r.top_ids[static_cast<size_t>(i)]) &&
           put<float>(file_, r.top_log_probs[static_cast<size_t>(i)]);
    }
    ok = ok && put<float>(file_, r.rest_log_prob);
  }
  if (!ok) return Status::errorf("write to KLD baseline '{}' failed", path_);
  ++count_;
  return Status::ok_status();
}

Status KldWriter::finish() {
  const bool ok = std::fseek(file_, static_cast<long>(kCountOffset), SEEK_SET) == 0 && put<uint64_t>(file_, count_);
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!ok || !closed) return Status::errorf("cannot finish KLD baseline '{}'", path_);
  return Status::ok_status();
}

Result<std::unique_ptr<KldReader>> KldReader::open(const std::string& path) {
  std::unique_ptr<KldReader> r(new KldReader());
  r->path_ = path;
  r->file_ = std::fopen(path.c_str(), "rb");
  if (!r->file_) return Status::errorf("cannot open KLD baseline '{}': {}", path, std::strerror(errno));
  char magic[8];
  uint32_t version = 0, vocab = 0, ctx = 0, storage = 0, top_k = 0, name_len = 0;
  uint64_t count = 0, model_size = 0;
  if (std::fread(magic, 1, 8, r->file_) != 8 || std::memcmp(magic, kMagic, 8) != 0) {
    return Status::errorf("'{}' is not a kvlm KLD baseline (bad magic)", path);
  }
  if (!get(r->file_, version) || !get(r->file_, vocab) || !get(r->file_, ctx) || !get(r->file_, storage) ||
      !get(r->file_, top_k) || !get(r->file_, count) || !get(r->file_, model_size) || !get(r->file_, name_len)) {
    return Status::errorf("KLD baseline '{}' has a truncated header", path);
  }
  if (version != kVersion) {
    return Status::errorf("KLD baseline '{}' has version {}, expected {}", path, version, kVersion);
  }
  if (vocab == 0 || vocab > (1u << 24) || ctx == 0 || name_len > 4096) {
    return Status::errorf("KLD baseline '{}' has a corrupt header", path);
  }
  r->header_.vocab = static_cast<int>(vocab);
  r->header_.ctx = static_cast<int>(ctx);
  r->header_.count = count;
  r->header_.model_size = model_size;
  if (storage != (r->header_.full() ? 0u : 1u) || top_k != static_cast<uint32_t>(kKldTopK)) {
    return Status::errorf("KLD baseline '{}' has storage {} / top-k {} that vocab {} does not use", path, storage,
                          top_k, vocab);
  }
  r->header_.model_name.resize(name_len);
  if (std::fread(r->header_.model_name.data(), 1, name_len, r->file_) != name_len) {
    return Status::errorf("KLD baseline '{}' has a truncated header", path);
  }
  const uint64_t header_bytes = kCountOffset + 8 + 8 + 4 + name_len;
  std::error_code ec;
  const uint64_t file_size = std::filesystem::file_size(path, ec);
  if (ec || file_size != header_bytes + count * record_bytes(r->header_)) {
    return Status::errorf("KLD baseline '{}' is {} bytes, but its header promises {} records ({} bytes)", path,
                          file_size, count, header_bytes + count * record_bytes(r->header_));
  }
  return r;
}

KldReader::~KldReader() {
  if (file_) std::fclose(file_);
}

Status KldReader::check_matches(const KldHeader& cur, bool other_model_ok) const {
  const KldHeader& b = header_;
  if (!other_model_ok && (b.model_name != cur.model_name || b.model_size != cur.model_size)) {
    return Status::errorf(
        "KLD baseline '{}' was made with model {} ({} bytes), not {} ({} bytes); --kld-other-model compares "
        "against another file of the same vocabulary",
        path_, b.model_name, b.model_size, cur.model_name, cur.model_size);
  }
  if (b.vocab != cur.vocab) {
    return Status::errorf("KLD baseline '{}' has vocab {}, the model {}", path_, b.vocab, cur.vocab);
  }
  if (b.ctx != cur.ctx) {
    return Status::errorf("KLD baseline '{}' was made with --ctx {}, this run uses {}", path_, b.ctx, cur.ctx);
  }
  if (b.count != cur.count) {
    return Status::errorf(
        "KLD baseline '{}' holds {} scored tokens, this run scores {} (different text or --max-chunks)", path_,
        b.count, cur.count);
  }
  return Status::ok_status();
}

Status KldReader::read(KldRecord& r) {
  if (read_ >= header_.count) return Status::errorf("KLD baseline '{}' has only {} records", path_, header_.count);
  bool ok = get(file_, r.target) && get(file_, r.target_log_prob);
  if (header_.full()) {
    r.log_probs.resize(static_cast<size_t>(header_.vocab));
    r.top_ids.clear();
    r.top_log_probs.clear();
    ok = ok && std::fread(r.log_probs.data(), 4, r.log_probs.size(), file_) == r.log_probs.size();
  } else {
    r.log_probs.clear();
    r.top_ids.resize(kKldTopK);
    r.top_log_probs.resize(kKldTopK);
    for (size_t i = 0; i < static_cast<size_t>(kKldTopK) && ok; ++i) {
      ok = get(file_, r.top_ids[i]) && get(file_, r.top_log_probs[i]);
      ok = ok && r.top_ids[i] >= 0 && r.top_ids[i] < header_.vocab;
    }
    ok = ok && get(file_, r.rest_log_prob);
  }
  if (!ok || r.target < 0 || r.target >= header_.vocab) {
    return Status::errorf("KLD baseline '{}': record {} is unreadable or corrupt", path_, read_);
  }
  ++read_;
  return Status::ok_status();
}

}  // namespace kvlm
