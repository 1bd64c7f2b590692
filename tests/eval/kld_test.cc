// KL divergence: hand-computed values, percentiles, the baseline file, and F16 vs F32 on stories260K.
#include "eval/kld.h"

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "eval/perplexity.h"
#include "model/llama_model.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

std::vector<double> logs(const std::vector<double>& p) {
  std::vector<double> out;
  for (double x : p) out.push_back(std::log(x));
  return out;
}

TEST(Kld, SelfIsZeroAndHandComputedPairMatches) {
  const std::vector<double> p = logs({0.5, 0.25, 0.25});
  const std::vector<double> q = logs({0.25, 0.5, 0.25});
  EXPECT_EQ(kl_divergence(p, p), 0.0);
  // 0.5 ln 2 + 0.25 ln 0.5 + 0 = 0.25 ln 2
  EXPECT_NEAR(kl_divergence(p, q), 0.25 * std::log(2.0), 1e-15);
  // Through a stored (float32) record: self is exactly 0, the pair within float rounding.
  const KldRecord rec = make_kld_record(p, 1);
  EXPECT_EQ(kl_divergence(rec, p), 0.0);
  EXPECT_NEAR(kl_divergence(rec, q), 0.25 * std::log(2.0), 1e-7);
}

TEST(Kld, TopKRecordForLargeVocabulary) {
  // 5000 ids > kKldFullVocabMax: the record keeps the top 64 and a rest bucket.
  constexpr int kVocab = 5000;
  std::vector<double> logits(kVocab, 0.0);
  for (int i = 0; i < 10; ++i) logits[static_cast<size_t>(i * 7)] = 8.0 - i;
  double z = 0;
  for (double x : logits) z += std::exp(x);
  std::vector<double> lp;
  for (double x : logits) lp.push_back(x - std::log(z));
  const KldRecord rec = make_kld_record(lp, 7);
  ASSERT_TRUE(rec.log_probs.empty());
  ASSERT_EQ(rec.top_ids.size(), static_cast<size_t>(kKldTopK));
  EXPECT_EQ(rec.top_ids[0], 0);
  EXPECT_EQ(rec.top_ids[1], 7);
  EXPECT_EQ(kl_divergence(rec, lp), 0.0);
  // Against a different distribution the bucketed KLD is positive and at most the full KLD.
  std::vector<double> lq = lp;
  std::swap(lq[0], lq[7]);
  const double full = kl_divergence(std::span<const double>(lp), std::span<const double>(lq));
  const double approx = kl_divergence(rec, lq);
  EXPECT_GT(approx, 0.0);
  EXPECT_LE(approx, full * (1 + 1e-5));
  EXPECT_NEAR(approx, full, 1e-4 * full);  // the swap happens inside the kept ids
}

TEST(Kld, PercentileInterpolates) {
  std::vector<double> v;
  for (int i = 100; i >= 0; --i) v.push_back(i);
  EXPECT_DOUBLE_EQ(percentile(v, 0.99), 99.0);
  EXPECT_DOUBLE_EQ(percentile(v, 0.5), 50.0);
  EXPECT_DOUBLE_EQ(percentile({1.0, 3.0}, 0.5), 2.0);
  EXPECT_DOUBLE_EQ(percentile({4.0}, 0.99), 4.0);
}

TEST(Kld, AccumulatorStatsOnHandMadeData) {
  KldAccumulator acc;
  // base p(target) = 0.5 everywhere; current 0.5, 0.25, 0.5, 1.0.
  acc.add(0.0, std::log(0.5), std::log(0.5), true);
  acc.add(0.2, std::log(0.5), std::log(0.25), false);
  acc.add(0.1, std::log(0.5), std::log(0.5), true);
  acc.add(0.3, std::log(0.5), std::log(1.0), true);
  const KldStats s = acc.finish();
  EXPECT_EQ(s.count, 4);
  EXPECT_NEAR(s.mean_kld, 0.15, 1e-15);
  EXPECT_NEAR(s.kld_p99, 0.2 + 0.1 * 0.97, 1e-12);  // pos 2.97 between 0.2 and 0.3
  EXPECT_DOUBLE_EQ(s.max_kld, 0.3);
  EXPECT_DOUBLE_EQ(s.top1_agreement, 0.75);
  EXPECT_NEAR(s.rms_dp, std::sqrt((0.0625 + 0.25) / 4), 1e-12);
  EXPECT_NEAR(s.base_ppl, 2.0, 1e-12);
  EXPECT_NEAR(s.cur_ppl, std::exp((3 * std::log(2.0) + std::log(4.0) - 0.0 - std::log(2.0)) / 4), 1e-12);
  EXPECT_NEAR(s.delta_ppl, s.cur_ppl - 2.0, 1e-15);
}

TEST(Kld, BaselineFileRoundTripsAndRejectsMismatches) {
  const auto path = (testing::scratch_dir("kld_file") / "base.bin").string();
  KldHeader h{3, 16, 0, 1234, "m.gguf"};
  auto w = KldWriter::create(path, h).value();
  const std::vector<double> p = logs({0.5, 0.25, 0.25});
  ASSERT_TRUE(w->write(make_kld_record(p, 2)).ok());
  ASSERT_TRUE(w->write(make_kld_record(p, 0)).ok());
  ASSERT_TRUE(w->finish().ok());
  auto r = KldReader::open(path).value();
  EXPECT_EQ(r->header().count, 2u);
  h.count = 2;
  EXPECT_TRUE(r->check_matches(h).ok());
  KldHeader other = h;
  other.ctx = 32;
  EXPECT_NE(r->check_matches(other).message().find("--ctx 16"), std::string::npos);
  other = h;
  other.model_name = "x.gguf";
  EXPECT_FALSE(r->check_matches(other).ok());
  other = h;
  other.count = 3;
  EXPECT_FALSE(r->check_matches(other).ok());
  KldRecord rec;
  ASSERT_TRUE(r->read(rec).ok());
  EXPECT_EQ(rec.target, 2);
  EXPECT_FLOAT_EQ(rec.log_probs[0], static_cast<float>(std::log(0.5)));
  ASSERT_TRUE(r->read(rec).ok());
  EXPECT_FALSE(r->read(rec).ok());  // past the end
  // A truncated file is refused at open.
  auto bytes = testing::read_bytes(path);
  bytes.pop_back();
  testing::write_bytes(path, bytes);
  EXPECT_FALSE(KldReader::open(path).ok());
}

TEST(KldStories, F16AgainstF32BaselineIsTinyAndSelfIsZero) {
  KVLM_REQUIRE_SHARED(model_path, "stories260K.gguf");
  KVLM_REQUIRE_SHARED(text_path, "tinystories_valid_head.txt");
  auto model = LlamaModel::load(model_path.string()).value();
  std::ifstream in(text_path, std::ios::binary);
  std::string text(100 * 1024, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  const std::vector<TokenId> tokens = model->tokenizer().encode(text, model->tokenizer().add_bos());
  ThreadPool pool(2);
  PerplexityOptions options;
  options.ctx = 256;
  options.max_windows = 16;

  std::vector<KldRecord> base;
  auto save = [&](std::span<const double> lp, TokenId target) {
    base.push_back(make_kld_record(lp, target));
    return Status::ok_status();
  };
  const PerplexityResult f32 = evaluate_perplexity(*model, pool, tokens, options, save).value();
  ASSERT_EQ(base.size(), static_cast<size_t>(f32.stats.num_scored));

  auto compare = [&](KvType type) {
    KldAccumulator acc;
    size_t i = 0;
    auto cmp = [&](std::span<const double> lp, TokenId target) {
      EXPECT_EQ(base[i].target, target);
      acc.add(base[i++], lp);
      return Status::ok_status();
    };
    options.k_type = options.v_type = type;
    const PerplexityResult run = evaluate_perplexity(*model, pool, tokens, options, cmp).value();
    EXPECT_EQ(i, base.size());
    const KldStats s = acc.finish();
    EXPECT_NEAR(s.base_ppl, f32.stats.ppl, 1e-5 * f32.stats.ppl);
    EXPECT_NEAR(s.cur_ppl, run.stats.ppl, 1e-5 * run.stats.ppl);
    return s;
  };
  const KldStats f16 = compare(KvType::kF16);
  EXPECT_GE(f16.mean_kld, 0.0);
  EXPECT_LT(f16.mean_kld, 1e-3);
  EXPECT_GT(f16.top1_agreement, 0.99);
  EXPECT_LT(std::abs(f16.delta_ppl), 0.01);

  const KldStats self = compare(KvType::kF32);
  EXPECT_EQ(self.mean_kld, 0.0);
  EXPECT_EQ(self.kld_p99, 0.0);
  EXPECT_EQ(self.top1_agreement, 1.0);
  EXPECT_EQ(self.rms_dp, 0.0);
  EXPECT_EQ(self.delta_ppl, 0.0);
}

}  // namespace
}  // namespace kvlm
