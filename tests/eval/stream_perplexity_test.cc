// Stream perplexity: segment bookkeeping on a cache stub with known logits, the full cache against a
// plain single-forward loop on a synthetic model, chunk independence, KV accounting, and errors.
#include "eval/stream_perplexity.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kv/kv_storage.h"
#include "model/llama_model.h"
#include "model/model_synthesizer.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

// A tiny random model (context 256, vocab 512) written to the test's scratch folder.
std::unique_ptr<LlamaModel> synthetic_model(const std::string& name) {
  SynthOptions options;
  options.shape = synth_preset("tiny-gqa").value();
  options.seed = 5;
  options.out_path = (testing::scratch_dir(name) / "tiny.gguf").string();
  EXPECT_TRUE(synthesize_model(options).ok());
  return LlamaModel::load(options.out_path).value();
}

// Tokens [0, n) with BOS first and ordinary ids after it, so every row has a definite target.
std::vector<TokenId> stream_tokens(int n, int vocab) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  t[0] = 1;
  for (int i = 1; i < n; ++i) t[static_cast<size_t>(i)] = 3 + (i * 37 + i / 7) % (vocab - 3);
  return t;
}

// The stub's logit row at position p: zero except a peak of height (p % 5) * 0.5 at one id.
constexpr int kStubBlockSize = 16;
constexpr uint64_t kStubBytesPerBlock = 100;
TokenId stub_peak(int64_t p, int vocab) { return static_cast<TokenId>((p * 7 + 3) % vocab); }
double stub_height(int64_t p) { return static_cast<double>(p % 5) * 0.5; }
double stub_nll(int64_t p, TokenId target, int vocab) {
  const double h = stub_height(p);
  const double log_z = std::log(static_cast<double>(vocab - 1) + std::exp(h));
  return log_z - (target == stub_peak(p, vocab) ? h : 0.0);
}

// Records what it was fed and answers with the known logits; holds ceil(fed / 16) blocks.
class StubCache final : public EvalSequenceCache {
 public:
  StubCache(int vocab, std::vector<TokenId>* fed, std::vector<int>* forward_sizes)
      : vocab_(vocab), fed_(fed), forward_sizes_(forward_sizes) {}
  void forward(std::span<const TokenId> tokens, LogitsRows rows, std::vector<float>& logits) override {
    EXPECT_EQ(rows, LogitsRows::kAll);
    logits.assign(tokens.size() * static_cast<size_t>(vocab_), 0.0f);
    for (size_t r = 0; r < tokens.size(); ++r) {
      const int64_t p = num_fed_ + static_cast<int64_t>(r);
      logits[r * static_cast<size_t>(vocab_) + static_cast<size_t>(stub_peak(p, vocab_))] =
          static_cast<float>(stub_height(p));
    }
    fed_->insert(fed_->end(), tokens.begin(), tokens.end());
    forward_sizes_->push_back(static_cast<int>(tokens.size()));
    num_fed_ += static_cast<int64_t>(tokens.size());
  }
  void reset() override { num_fed_ = 0; }
  int64_t num_fed() const override { return num_fed_; }
  int64_t num_cached() const override { return num_fed_; }
  int num_blocks_held() const override { return static_cast<int>((num_fed_ + kStubBlockSize - 1) / kStubBlockSize); }
  uint64_t bytes_per_block() const override { return kStubBytesPerBlock; }

 private:
  int vocab_;
  std::vector<TokenId>* fed_;
  std::vector<int>* forward_sizes_;
  int64_t num_fed_ = 0;
};

TEST(StreamPerplexity, SegmentsMatchAPlainLoopOverKnownLogits) {
  auto model = synthetic_model("stream_stub");
  const int vocab = model->config().vocab_size;
  ThreadPool pool(1);
  const std::vector<TokenId> tokens = stream_tokens(1200, vocab);
  std::vector<TokenId> fed;
  std::vector<int> sizes;
  StreamOptions options;
  options.num_tokens = 1000;
  options.segment = 300;
  options.chunk = 128;
  options.trained_ctx = 450;
  options.make_cache = [&](LlamaModel&, ThreadPool&, const EvalCacheRequest& request)
      -> Result<std::unique_ptr<EvalSequenceCache>> {
    EXPECT_EQ(request.max_tokens, 1000);
    return std::unique_ptr<EvalSequenceCache>(new StubCache(vocab, &fed, &sizes));
  };
  const StreamResult r = evaluate_stream(*model, pool, tokens, options).value();

  // Tokens 0..998 were fed in order (the last token is only a target); no forward crossed a
  // segment boundary (300, 600, 900) and none exceeded the chunk.
  ASSERT_EQ(fed.size(), 999u);
  EXPECT_TRUE(std::equal(fed.begin(), fed.end(), tokens.begin()));
  int64_t pos = 0;
  for (int s : sizes) {
    EXPECT_LE(s, 128);
    EXPECT_EQ(pos / 300, (pos + s - 1) / 300) << "forward [" << pos << ", " << pos + s << ") crosses a boundary";
    pos += s;
  }

  // The plain loop: NLL of each prediction from the known logits, then per-segment means.
  std::vector<double> nll;
  for (int64_t p = 0; p < 999; ++p) nll.push_back(stub_nll(p, tokens[static_cast<size_t>(p + 1)], vocab));
  const int64_t bounds[] = {0, 300, 600, 900, 999};
  const int64_t past[] = {0, 150, 300, 99};
  ASSERT_EQ(r.segments.size(), 4u);
  for (int k = 0; k < 4; ++k) {
    const StreamSegment& s = r.segments[static_cast<size_t>(k)];
    EXPECT_EQ(s.index, k);
    EXPECT_EQ(s.first_position, bounds[k]);
    EXPECT_EQ(s.end_position, bounds[k + 1]);
    EXPECT_EQ(s.stats.num_scored, bounds[k + 1] - bounds[k]);
    double sum = 0;
    for (int64_t p = bounds[k]; p < bounds[k + 1]; ++p) sum += nll[static_cast<size_t>(p)];
    const double mean = sum / static_cast<double>(bounds[k + 1] - bounds[k]);
    EXPECT_NEAR(s.stats.mean_nll, mean, 1e-12) << "segment " << k;
    EXPECT_NEAR(s.stats.ppl, std::exp(mean), 1e-9) << "segment " << k;
    EXPECT_EQ(s.num_past_context, past[k]) << "segment " << k;
    EXPECT_EQ(s.kv_cached_tokens, bounds[k + 1]);
    EXPECT_EQ(s.kv_blocks, (bounds[k + 1] + 15) / 16);
    EXPECT_EQ(s.kv_bytes, static_cast<uint64_t>((bounds[k + 1] + 15) / 16) * kStubBytesPerBlock);
  }
  double sum = 0, in_sum = 0;
  for (size_t p = 0; p < nll.size(); ++p) {
    sum += nll[p];
    if (p < 450) in_sum += nll[p];
  }
  EXPECT_EQ(r.overall.num_scored, 999);
  EXPECT_NEAR(r.overall.mean_nll, sum / 999, 1e-12);
  EXPECT_EQ(r.in_context.num_scored, 450);
  EXPECT_NEAR(r.in_context.mean_nll, in_sum / 450, 1e-12);
  EXPECT_EQ(r.past_context.num_scored, 549);
  EXPECT_NEAR(r.past_context.mean_nll, (sum - in_sum) / 549, 1e-12);
  EXPECT_EQ(r.trained_ctx, 450);
  EXPECT_EQ(r.kv_bytes_peak, static_cast<uint64_t>((999 + 15) / 16) * kStubBytesPerBlock);
}

// The full cache on a real (synthetic) model against one forward over the whole stream.
TEST(StreamPerplexity, FullCacheMatchesOneForwardAndIgnoresChunking) {
  auto model = synthetic_model("stream_full");
  const ModelConfig& c = model->config();
  ASSERT_EQ(c.context_length, 256);
  ThreadPool pool(2);
  constexpr int kTokens = 600;  // well past the model's context of 256
  const std::vector<TokenId> tokens = stream_tokens(kTokens, c.vocab_size);

  // Plain loop: one forward of tokens [0, 599) into a fresh cache, every row scored.
  constexpr int kBlock = 16;
  const int num_blocks = (kTokens + kBlock - 1) / kBlock;
  KvStorage storage(KvLayout{c.num_layers, c.num_kv_heads, c.head_dim, kBlock}, KvType::kF32, KvType::kF32,
                    num_blocks);
  std::vector<int32_t> table(static_cast<size_t>(num_blocks));
  for (int b = 0; b < num_blocks; ++b) table[static_cast<size_t>(b)] = b;
  std::vector<float> logits;
  model->forward(SequenceStep{std::span<const TokenId>(tokens).first(kTokens - 1), 0, table, LogitsRows::kAll},
                 storage, pool, logits);
  std::vector<double> nll;
  score_rows(logits, c.vocab_size, std::span<const TokenId>(tokens).subspan(1), nll);

  StreamOptions options;
  options.segment = 128;
  options.chunk = 256;
  options.cache.block_size = kBlock;
  const StreamResult a = evaluate_stream(*model, pool, tokens, options).value();
  EXPECT_EQ(a.num_tokens, kTokens);
  EXPECT_EQ(a.trained_ctx, 256);  // the GGUF's context_length
  ASSERT_EQ(a.segments.size(), 5u);  // 128 x 4 + 87
  const uint64_t bytes_per_block = storage.bytes_per_block();
  EXPECT_EQ(a.kv_bytes_per_block, bytes_per_block);
  for (const StreamSegment& s : a.segments) {
    double sum = 0;
    for (int64_t p = s.first_position; p < s.end_position; ++p) sum += nll[static_cast<size_t>(p)];
    const double mean = sum / static_cast<double>(s.end_position - s.first_position);
    EXPECT_NEAR(s.stats.mean_nll, mean, 1e-4 * std::max(1.0, mean)) << "segment " << s.index;
    EXPECT_EQ(s.kv_blocks, (s.end_position + kBlock - 1) / kBlock);
    EXPECT_EQ(s.kv_bytes, static_cast<uint64_t>(s.kv_blocks) * bytes_per_block);
    EXPECT_EQ(s.num_past_context > 0, s.end_position > 256) << "segment " << s.index;
  }
  EXPECT_EQ(a.segments.back().end_position, kTokens - 1);
  EXPECT_EQ(a.overall.num_scored, kTokens - 1);

  // Other chunk and block sizes: the same numbers up to float noise; the bytes follow the blocks.
  options.chunk = 37;
  options.cache.block_size = 7;
  const StreamResult b = evaluate_stream(*model, pool, tokens, options).value();
  ASSERT_EQ(b.segments.size(), a.segments.size());
  for (size_t k = 0; k < a.segments.size(); ++k) {
    EXPECT_NEAR(b.segments[k].stats.mean_nll, a.segments[k].stats.mean_nll, 1e-4) << "segment " << k;
    EXPECT_EQ(b.segments[k].kv_blocks, (b.segments[k].end_position + 6) / 7);
    EXPECT_EQ(b.segments[k].kv_bytes, static_cast<uint64_t>(b.segments[k].kv_blocks) * b.kv_bytes_per_block);
  }
  EXPECT_NEAR(b.overall.mean_nll, a.overall.mean_nll, 1e-5);
}

TEST(StreamPerplexity, ErrorsNameTheProblem) {
  auto model = synthetic_model("stream_errors");
  ThreadPool pool(1);
  const std::vector<TokenId> tokens = stream_tokens(100, model->config().vocab_size);
  StreamOptions options;
  options.num_tokens = 150;
  auto r = evaluate_stream(*model, pool, tokens, options);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("100 tokens"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("--tokens 150"), std::string::npos) << r.status().message();

  options.num_tokens = 50;
  options.segment = 0;
  r = evaluate_stream(*model, pool, tokens, options);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--segment"), std::string::npos) << r.status().message();
  options.segment = 16;
  options.chunk = 0;
  EXPECT_FALSE(evaluate_stream(*model, pool, tokens, options).ok());
  options.chunk = 16;
  options.num_tokens = 1;
  EXPECT_FALSE(evaluate_stream(*model, pool, tokens, options).ok());
  options.num_tokens = 50;
  options.cache.block_size = 0;
  EXPECT_FALSE(evaluate_stream(*model, pool, tokens, options).ok());
  options.cache.block_size = 16;
  std::vector<TokenId> bad = tokens;
  bad[10] = 100000;
  EXPECT_FALSE(evaluate_stream(*model, pool, bad, options).ok());
  EXPECT_TRUE(evaluate_stream(*model, pool, tokens, options).ok());
}

}  // namespace
}  // namespace kvlm
