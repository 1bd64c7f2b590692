// Perplexity: the pure scoring on hand-made logits, the window plan, and stories260K end to end.
#include "eval/perplexity.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/llama_model.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

TEST(Perplexity, UniformLogitsGiveTheVocabularySize) {
  constexpr int kVocab = 37;
  constexpr int kRows = 5;
  const std::vector<float> logits(kRows * kVocab, 0.25f);  // [rows, vocab]
  const std::vector<TokenId> targets = {0, 5, 36, 12, 7};
  std::vector<double> nll;
  score_rows(logits, kVocab, targets, nll);
  ASSERT_EQ(nll.size(), 5u);
  for (double x : nll) EXPECT_NEAR(x, std::log(37.0), 1e-12);
  const PerplexityStats s = perplexity_from_nll(nll);
  EXPECT_EQ(s.num_scored, 5);
  EXPECT_NEAR(s.ppl, 37.0, 1e-9);
  EXPECT_NEAR(s.ppl_stderr, 0.0, 1e-9);
}

TEST(Perplexity, PeakedLogitsGiveTheHandComputedNll) {
  // Row: logit 3 for one id, 0 for the other three. p(peak) = e^3 / (e^3 + 3).
  const std::vector<float> logits = {3, 0, 0, 0,   // row 0: target 0 (the peak)
                                     0, 0, 3, 0};  // row 1: target 1 (not the peak)
  const std::vector<TokenId> targets = {0, 1};
  std::vector<double> nll;
  score_rows(logits, 4, targets, nll);
  const double z = std::exp(3.0) + 3.0;
  const double nll0 = -(3.0 - std::log(z));
  const double nll1 = std::log(z);
  EXPECT_NEAR(nll[0], nll0, 1e-12);
  EXPECT_NEAR(nll[1], nll1, 1e-12);
  const PerplexityStats s = perplexity_from_nll(nll);
  const double mean = (nll0 + nll1) / 2;
  EXPECT_NEAR(s.mean_nll, mean, 1e-12);
  EXPECT_NEAR(s.ppl, std::exp(mean), 1e-12);
  // Two samples: sample stderr of the mean is |a - b| / 2.
  EXPECT_NEAR(s.nll_stderr, std::abs(nll0 - nll1) / 2, 1e-12);
  EXPECT_NEAR(s.ppl_stderr, std::exp(mean) * std::abs(nll0 - nll1) / 2, 1e-12);
}

TEST(Perplexity, LogSoftmaxIsStableForLargeLogits) {
  const std::vector<float> logits = {1000.0f, 1000.0f};
  std::vector<double> out;
  log_softmax(logits, out);
  EXPECT_NEAR(out[0], -std::log(2.0), 1e-12);
  EXPECT_NEAR(out[1], -std::log(2.0), 1e-12);
}

TEST(Perplexity, WindowPlanFollowsLlamaCppConvention) {
  WindowPlan p = plan_windows(1000, 256, 0);
  EXPECT_EQ(p.num_windows, 3);  // 1000 / 256, trailing 232 tokens dropped
  EXPECT_EQ(p.first_scored, 128);
  EXPECT_EQ(p.scored_per_window, 127);
  EXPECT_EQ(p.num_scored, 381);
  p = plan_windows(512, 512, 0);
  EXPECT_EQ(p.num_windows, 1);
  EXPECT_EQ(p.num_scored, 255);
  p = plan_windows(511, 512, 0);
  EXPECT_EQ(p.num_windows, 0);
  p = plan_windows(10000, 100, 7);
  EXPECT_EQ(p.num_windows, 7);
  EXPECT_EQ(p.num_scored, 7 * 49);
  p = plan_windows(99, 9, 0);  // odd ctx: first 4, positions 4..7 scored
  EXPECT_EQ(p.num_windows, 11);
  EXPECT_EQ(p.scored_per_window, 4);
}

std::vector<TokenId> stories_tokens(const LlamaModel& model, size_t bytes) {
  auto path = testing::shared_file("tinystories_valid_head.txt");
  if (!path) return {};
  std::ifstream in(*path, std::ios::binary);
  std::string text(bytes, '\0');
  in.read(text.data(), static_cast<std::streamsize>(bytes));
  text.resize(static_cast<size_t>(in.gcount()));
  return model.tokenizer().encode(text, model.tokenizer().add_bos());
}

TEST(PerplexityStories, PplInExpectedRangeAndIndependentOfChunking) {
  KVLM_REQUIRE_SHARED(model_path, "stories260K.gguf");
  KVLM_REQUIRE_SHARED(text_path, "tinystories_valid_head.txt");
  auto model = LlamaModel::load(model_path.string()).value();
  const std::vector<TokenId> tokens = stories_tokens(*model, 100 * 1024);
  ThreadPool pool(2);
  PerplexityOptions options;
  options.ctx = 256;
  options.max_windows = 24;
  options.prefill_chunk = 256;
  const PerplexityResult a = evaluate_perplexity(*model, pool, tokens, options).value();
  EXPECT_EQ(a.plan.num_windows, 24);
  EXPECT_EQ(a.stats.num_scored, 24 * 127);
  EXPECT_GE(a.stats.ppl, 3.0);
  EXPECT_LE(a.stats.ppl, 6.0);
  EXPECT_GT(a.stats.ppl_stderr, 0.0);
  // The live pool held exactly one window: ctx / block_size full blocks, matching the formula.
  EXPECT_EQ(a.kv_bytes_peak, a.kv_bytes_formula);

  options.prefill_chunk = 37;  // chunks that straddle the scored half
  const PerplexityResult b = evaluate_perplexity(*model, pool, tokens, options).value();
  EXPECT_EQ(b.stats.num_scored, a.stats.num_scored);
  EXPECT_NEAR(b.stats.mean_nll, a.stats.mean_nll, 1e-5);
}

TEST(PerplexityStories, ErrorsForShortTextAndBadCtx) {
  KVLM_REQUIRE_SHARED(model_path, "stories260K.gguf");
  auto model = LlamaModel::load(model_path.string()).value();
  ThreadPool pool(1);
  const std::vector<TokenId> tokens(100, 1);
  PerplexityOptions options;
  options.ctx = 256;
  auto r = evaluate_perplexity(*model, pool, tokens, options);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("at least 256 tokens"), std::string::npos) << r.status().message();
  options.ctx = 4;
  EXPECT_FALSE(evaluate_perplexity(*model, pool, tokens, options).ok());
  options.ctx = model->config().context_length + 1;
  EXPECT_FALSE(evaluate_perplexity(*model, pool, tokens, options).ok());
}

}  // namespace
}  // namespace kvlm
