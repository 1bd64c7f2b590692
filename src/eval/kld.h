// KL divergence of a run against a saved baseline: the baseline file and the statistics.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/ids.h"
#include "core/status.h"

namespace kvlm {

// Baseline file (little-endian), one record per scored token in evaluation order:
//   header: magic "KVLMKLD\0", u32 version (1), u32 vocab, u32 ctx, u32 storage (0 full, 1 top-k),
//           u32 top_k, u64 count, u64 model file size, u32 name length, model file name bytes
//   record: i32 target token, f32 baseline log-prob of the target, then
//     full  (vocab <= kKldFullVocabMax): vocab x f32 log-probs;
//     top-k (larger vocabularies):       kKldTopK x (i32 id, f32 log-prob), most likely first,
//                                        then f32 log of the summed probability of all other ids.
// With top-k storage the KLD is computed over the kept ids plus one "rest" bucket (an
// approximation that can only underestimate the full KLD).
inline constexpr int kKldFullVocabMax = 4096;
inline constexpr int kKldTopK = 64;

struct KldHeader {
  int vocab = 0;
  int ctx = 0;
  uint64_t count = 0;            // scored tokens
  uint64_t model_size = 0;       // bytes of the model file
  std::string model_name;        // model file name without folders
  bool full() const { return vocab <= kKldFullVocabMax; }
};

// One baseline token as stored (log-probs rounded to float32).
struct KldRecord {
  TokenId target = 0;
  float target_log_prob = 0;
  std::vector<float> log_probs;      // full: [vocab]
  std::vector<int32_t> top_ids;      // top-k: [kKldTopK], most likely first
  std::vector<float> top_log_probs;  // top-k: [kKldTopK]
  float rest_log_prob = 0;           // top-k: log of the summed probability of the other ids
};

// Builds the record for one token's log-probabilities ([vocab]) and its target.
KldRecord make_kld_record(std::span<const double> log_probs, TokenId target);

// KL(P_base || Q_cur) for a record against the current log-probs ([vocab]), in double. The
// current log-probs are rounded to float32 first, as the baseline's were, so a run compared
// with its own baseline gives exactly 0.
double kl_divergence(const KldRecord& base, std::span<const double> cur_log_probs);
// Plain KL(P || Q) of two full log-prob vectors: sum p (log p - log q).
double kl_divergence(std::span<const double> base_log_probs, std::span<const double> cur_log_probs);

// The q-quantile (q in [0, 1]) with linear interpolation between sorted neighbours.
double percentile(std::vector<double> values, double q);

struct KldStats {
  int64_t count = 0;
  double mean_kld = 0;
  double kld_stderr = 0;
  double kld_p99 = 0;
  double max_kld = 0;
  double top1_agreement = 0;  // share of tokens whose most likely id is the same in both runs
  double rms_dp = 0;          // sqrt(mean((p_cur(target) - p_base(target))^2)), probabilities in [0, 1]
  double base_ppl = 0;
  double cur_ppl = 0;
  double delta_ppl = 0;       // cur_ppl - base_ppl
};

// Accumulates per-token comparisons.
class KldAccumulator {
 public:
  void add(double kld, double base_target_log_prob, double cur_target_log_prob, bool top1_match);
  // Compares one record against the current log-probs and adds it.
  void add(const KldRecord& base, std::span<const double> cur_log_probs);
  KldStats finish() const;

 private:
  std::vector<double> kld_;
  double base_nll_sum_ = 0;
  double cur_nll_sum_ = 0;
  double dp_sq_sum_ = 0;
  int64_t top1_matches_ = 0;
};

class KldWriter {
 public:
  // Writes the header (count filled in by finish()).
  static Result<std::unique_ptr<KldWriter>> create(const std::string& path, const KldHeader& header);
  ~KldWriter();
  Status write(const KldRecord& record);
  // Writes the final count and closes the file.
  Status finish();

 private:
  KldWriter() = default;
  std::FILE* file_ = nullptr;
  std::string path_;
  KldHeader header_;
  uint64_t count_ = 0;
};

class KldReader {
 public:
  // Reads and validates the header and that the file holds exactly count records.
  static Result<std::unique_ptr<KldReader>> open(const std::string& path);
  ~KldReader();
  const KldHeader& header() const { return header_; }
  // Checks the baseline was made with the same model file, vocabulary, ctx and token count.
  // other_model_ok: the model file may differ (a quantized file against its F32 original); the
  // vocabulary, ctx and count must still match, and every record's target token is checked.
  Status check_matches(const KldHeader& current, bool other_model_ok = false) const;
  // The next record; an error past the end or on a short read.
  Status read(KldRecord& record);

 private:
  KldReader() = default;
  std::FILE* file_ = nullptr;
  std::string path_;
  KldHeader header_;
  uint64_t read_ = 0;
};

}  // namespace kvlm
