// kvlm run/chat: the tokenizer's warnings reach stderr (not --json stdout, not with --quiet); --special.
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "support/subprocess.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

using testing::kvlm_binary;
using testing::run_command;

const std::filesystem::path kStories =
    std::filesystem::path(KVLM_SOURCE_DIR) / "assets" / "stories260K" / "stories260K.gguf";

// stories260K with its "<0x00>" byte token renamed, so the tokenizer warns that byte 0 has
// no fallback token. Everything else (tensors included) is copied as it is.
std::filesystem::path model_with_tokenizer_warning() {
  const auto out = testing::scratch_dir("cli_tokenizer") / "warns.gguf";
  auto file = GgufFile::open(kStories.string());
  EXPECT_TRUE(file.ok()) << file.status().message();
  GgufWriter writer;
  for (const GgufKeyValue& kv : (*file)->metadata()) {
    if (kv.key == "general.alignment") continue;
    writer.set(kv.key, kv.value);
  }
  auto tokens = (*file)->get_string_array("tokenizer.ggml.tokens");
  EXPECT_TRUE(tokens.ok());
  for (std::string& token : *tokens) {
    if (token == "<0x00>") token = "<0xZZ>";
  }
  writer.set("tokenizer.ggml.tokens", GgufValue::string_array(*tokens));
  for (const GgufTensorInfo& t : (*file)->tensors()) {
    writer.add_tensor(t.name, t.type, t.dims, std::vector<uint8_t>(t.data, t.data + t.num_bytes));
  }
  const Status written = writer.write(out.string());
  EXPECT_TRUE(written.ok()) << written.message();
  return out;
}

TEST(CliTokenizerTest, WarningsGoToStderrUnlessQuiet) {
  const std::string model = model_with_tokenizer_warning().string();
  const std::string run = kvlm_binary() + " run --model " + model + " -p 'Once' --max-tokens 2 --temp 0";
  const auto plain = run_command(run);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_NE(plain.err.find("warning: tokenizer: 1 of 256 bytes"), std::string::npos) << plain.err;
  EXPECT_EQ(plain.out.find("warning"), std::string::npos) << plain.out;

  const auto json = run_command(run + " --json");
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_NE(json.err.find("warning: tokenizer:"), std::string::npos) << json.err;
  EXPECT_TRUE(nlohmann::json::accept(json.out)) << json.out;  // stdout is only the object

  const auto quiet = run_command(run + " --quiet");
  ASSERT_EQ(quiet.exit_code, 0) << quiet.err;
  EXPECT_EQ(quiet.err.find("warning"), std::string::npos) << quiet.err;

  // The embedded model's tokenizer is clean: nothing is printed.
  const auto clean = run_command(kvlm_binary() + " run -p 'Once' --max-tokens 2 --temp 0");
  ASSERT_EQ(clean.exit_code, 0) << clean.err;
  EXPECT_EQ(clean.err.find("warning"), std::string::npos) << clean.err;
}

TEST(CliTokenizerTest, SpecialParsesControlTokenTextInThePrompt) {
  const std::string run = kvlm_binary() + " run -p 'Once</s>' --max-tokens 1 --temp 0 --json";
  const auto as_text = run_command(run);
  const auto parsed = run_command(run + " --special");
  ASSERT_EQ(as_text.exit_code, 0) << as_text.err;
  ASSERT_EQ(parsed.exit_code, 0) << parsed.err;
  const int text_tokens = nlohmann::json::parse(as_text.out)["stats"]["prompt_tokens"].get<int>();
  const int parsed_tokens = nlohmann::json::parse(parsed.out)["stats"]["prompt_tokens"].get<int>();
  // "</s>" as characters takes several tokens; parsed, it is the one EOS token.
  EXPECT_LT(parsed_tokens, text_tokens);
  EXPECT_EQ(parsed_tokens, 3);  // <s>, "▁Once", </s>
}

}  // namespace
}  // namespace kvlm
