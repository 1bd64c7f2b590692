// End to end through the model: a synthetic model whose logits are known exactly gives the known
// perplexity. With the final norm's weights zero, every logit is 0, so every prediction is uniform
// over the vocabulary and both windowed and stream perplexity must equal the vocabulary size.
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/rng.h"
#include "eval/perplexity.h"
#include "eval/stream_perplexity.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "model/llama_model.h"
#include "model/model_synthesizer.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

// tiny-gqa with output_norm.weight = 0: the logits are exactly 0 for every token and position.
std::string uniform_logits_model() {
  const auto dir = testing::scratch_dir("known_logits_model");
  SynthOptions options;
  options.shape = synth_preset("tiny-gqa").value();
  options.out_path = (dir / "random.gguf").string();
  EXPECT_TRUE(synthesize_model(options).ok());
  auto file = GgufFile::open(options.out_path).value();
  GgufWriter writer;
  for (const GgufKeyValue& kv : file->metadata()) {
    if (kv.key != "general.alignment") writer.set(kv.key, kv.value);
  }
  for (const GgufTensorInfo& t : file->tensors()) {
    std::vector<uint8_t> bytes(t.data, t.data + t.num_bytes);
    if (t.name == "output_norm.weight") std::fill(bytes.begin(), bytes.end(), 0);
    writer.add_tensor(t.name, t.type, t.dims, std::move(bytes));
  }
  const std::string path = (dir / "uniform.gguf").string();
  EXPECT_TRUE(writer.write(path).ok());
  return path;
}

std::vector<TokenId> random_tokens(int n, int vocab) {
  Rng rng(3);
  std::vector<TokenId> tokens(static_cast<size_t>(n));
  for (TokenId& t : tokens) t = static_cast<TokenId>(rng.next_u64() % static_cast<uint64_t>(vocab));
  return tokens;
}

TEST(KnownLogits, WindowedAndStreamPerplexityEqualTheVocabularySize) {
  auto model = LlamaModel::load(uniform_logits_model()).value();
  const int vocab = model->config().vocab_size;
  ThreadPool pool(2);
  const std::vector<TokenId> tokens = random_tokens(300, vocab);

  PerplexityOptions ppl;
  ppl.ctx = 64;
  ppl.k_type = ppl.v_type = KvType::kInt4;  // the cache cannot matter when the logits are all 0
  const PerplexityResult windows = evaluate_perplexity(*model, pool, tokens, ppl).value();
  EXPECT_EQ(windows.stats.num_scored, 4 * 31);
  EXPECT_NEAR(windows.stats.ppl, vocab, 1e-9 * vocab);
  EXPECT_NEAR(windows.stats.mean_nll, std::log(vocab), 1e-12);
  EXPECT_NEAR(windows.stats.nll_stderr, 0.0, 1e-12);

  StreamOptions stream;
  stream.num_tokens = 300;
  stream.segment = 100;
  const StreamResult s = evaluate_stream(*model, pool, tokens, stream).value();
  ASSERT_EQ(s.segments.size(), 3u);
  for (const auto& segment : s.segments) EXPECT_NEAR(segment.stats.ppl, vocab, 1e-9 * vocab);
  EXPECT_EQ(s.overall.num_scored, 299);
}

}  // namespace
}  // namespace kvlm
