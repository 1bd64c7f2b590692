// End-to-end tests of the kvlm binary: acceptance outputs, JSON, and one-line errors.
#include <algorithm>
#include <filesystem>
#include <functional>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/subprocess.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

using testing::kvlm_binary;
using testing::run_command;

// The greedy story from the shared models README (the fenced block under "stories260K facts").
std::string known_story() {
  auto readme = testing::shared_file("README.md");
  if (!readme) return "";
  std::ifstream in(*readme);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  const size_t open = text.find("```\n");
  const size_t close = text.find("\n```", open + 4);
  if (open == std::string::npos || close == std::string::npos) return "";
  return text.substr(open + 4, close - open - 4);
}

int count_lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

TEST(Cli, Stories260KGreedyPrintsTheKnownStory) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  const std::string story = known_story();
  ASSERT_FALSE(story.empty()) << "could not find the story in the shared README";
  const auto r = run_command(kvlm_binary() + " run --model " + model.string() + " --max-tokens 200 --temp 0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, story + "\n");
}

TEST(Cli, ConvertedLlama2cCheckpointPrintsTheSameStory) {
  KVLM_REQUIRE_SHARED(checkpoint, "stories260K.bin");
  KVLM_REQUIRE_SHARED(tokenizer, "tok512.bin");
  const auto out = testing::scratch_dir("cli_convert") / "stories260K.gguf";
  auto c = run_command(kvlm_binary() + " convert llama2c --checkpoint " + checkpoint.string() + " --tokenizer " +
                       tokenizer.string() + " --out " + out.string());
  ASSERT_EQ(c.exit_code, 0) << c.err;
  const auto r = run_command(kvlm_binary() + " run --model " + out.string() + " --max-tokens 200 --temp 0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, known_story() + "\n");
}

TEST(Cli, JsonHasTextTokensAndStats) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  const auto r = run_command(kvlm_binary() + " run --model " + model.string() +
                             " --max-tokens 100 --temp 0 --json --kv-type f16 --block-size 8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["tokens"].size(), 101u);
  EXPECT_EQ(j["tokens"][0], 1);
  EXPECT_EQ(j["stats"]["prompt_tokens"], 1);
  EXPECT_EQ(j["stats"]["generated_tokens"], 100);
  // One prompt token and 99 fed-back tokens were projected; recomputation re-projects the context each step.
  EXPECT_EQ(j["stats"]["kv_projections_cached"], 100u);
  EXPECT_EQ(j["stats"]["kv_projections_recompute"], 1u + 5049u);  // 1 + (2 + 3 + ... + 100)
  // stories260K: 2 x 5 layers x 4 kv heads x 8 dims x 2 bytes.
  EXPECT_EQ(j["stats"]["kv_bytes_per_token"], 640u);
  EXPECT_EQ(j["stats"]["blocks_leaked"], 0);
  EXPECT_TRUE(j["text"].get<std::string>().starts_with("Once upon a time"));
}

TEST(Cli, MissingModelIsOneClearLine) {
  const auto r = run_command(kvlm_binary() + " run --model /nonexistent/model.gguf");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("/nonexistent/model.gguf"), std::string::npos) << r.err;
}

TEST(Cli, BadFlagValuesAreOneClearLine) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  for (const std::string flags : {"--kv-type q7", "--block-size 0", "--top-p 0", "--max-tokens -3", "--threads 100000", "--bogus-flag"}) {
    const auto r = run_command(kvlm_binary() + " run --model " + model.string() + " " + flags);
    EXPECT_NE(r.exit_code, 0) << flags;
    EXPECT_EQ(count_lines(r.err), 1) << flags << ": " << r.err;
    EXPECT_TRUE(r.out.empty() || r.out == "\n") << flags << ": " << r.out;
  }
}

TEST(Cli, PromptLongerThanTheContextIsRejected) {
  const auto dir = testing::scratch_dir("cli_context");
  const std::string model = (dir / "short.gguf").string();
  auto s = run_command(kvlm_binary() + " synth --preset tiny-mha --context 16 --out " + model);
  ASSERT_EQ(s.exit_code, 0) << s.err;
  const auto r = run_command(kvlm_binary() + " run --model " + model +
                             " --prompt 'a prompt that is certainly longer than sixteen tokens of this tiny vocabulary'");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("context"), std::string::npos) << r.err;
}

// The opening of stories260K's greedy story (the shared models README), which the embedded model
// must tell without any file beside the binary.
constexpr const char* kStoryOpening = "Once upon a time, there was a little girl named Lily";

TEST(Cli, DemoTellsTheEmbeddedStoryAndPasses) {
  // From another folder: the model is inside the binary.
  const auto r = run_command("cd / && " + kvlm_binary() + " demo --max-tokens 24");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("stories260K (embedded)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(std::string("\n") + kStoryOpening), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bytes per token (formula)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1,280"), std::string::npos) << r.out;  // f32: 2 x 5 layers x 4 kv heads x 8 dims x 4 bytes
  EXPECT_NE(r.out.find("int8"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("DISAGREES"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("PASS"), std::string::npos) << r.out;
}

TEST(Cli, DemoRunsOnAModelFile) {
  const std::string model = (testing::scratch_dir("cli_demo_file") / "tiny.gguf").string();
  ASSERT_EQ(run_command(kvlm_binary() + " synth --preset tiny-gqa --out " + model).exit_code, 0);
  const auto r = run_command(kvlm_binary() + " demo --max-tokens 16 --kv-type f16 --model " + model);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find(model), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("PASS"), std::string::npos) << r.out;
}

TEST(Cli, RunWithoutAModelUsesTheEmbeddedStories260K) {
  const auto r = run_command("cd / && " + kvlm_binary() + " run -n 20 --temp 0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(r.out.starts_with(kStoryOpening)) << r.out;
  ASSERT_TRUE(r.out.ends_with("\n")) << r.out;
  if (const std::string story = known_story(); !story.empty()) {
    EXPECT_TRUE(story.starts_with(r.out.substr(0, r.out.size() - 1))) << r.out;  // 20 tokens of the known story
  }
  const auto j = nlohmann::json::parse(run_command(kvlm_binary() + " run -n 5 --temp 0 --json").out);
  EXPECT_EQ(j["model"], "stories260K (embedded)");
  const auto empty = run_command(kvlm_binary() + " run --model ''");
  EXPECT_NE(empty.exit_code, 0);
  EXPECT_EQ(count_lines(empty.err), 1) << empty.err;
}

// The bytes compiled into kvlm are the repository's asset, which is the shared reference copy.
TEST(Cli, EmbeddedModelIsTheSharedFileByteForByte) {
  KVLM_REQUIRE_SHARED(shared, "stories260K.gguf");
  const std::vector<uint8_t> model = testing::read_bytes(shared);
  const std::vector<uint8_t> asset =
      testing::read_bytes(std::filesystem::path(KVLM_SOURCE_DIR) / "assets" / "stories260K" / "stories260K.gguf");
  EXPECT_EQ(asset.size(), 1185376u);
  EXPECT_TRUE(asset == model) << "assets/stories260K/stories260K.gguf differs from " << shared;
  const std::vector<uint8_t> binary = testing::read_bytes(kvlm_binary());
  const auto found = std::search(binary.begin(), binary.end(),
                                 std::boyer_moore_horspool_searcher(model.begin(), model.end()));
  EXPECT_NE(found, binary.end()) << "the kvlm binary does not hold the model's bytes";
  // inspect with no file inspects the embedded one.
  const auto r = run_command(kvlm_binary() + " inspect");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("stories260K (embedded)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("GQA"), std::string::npos) << r.out;
}

TEST(Cli, InspectShowsShapesAndKvBytes) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  const auto r = run_command(kvlm_binary() + " inspect " + model.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("llama"), std::string::npos);
  EXPECT_NE(r.out.find("GQA"), std::string::npos);
  EXPECT_NE(r.out.find("640"), std::string::npos) << r.out;   // f16 bytes per token
  EXPECT_NE(r.out.find("1280"), std::string::npos) << r.out;  // f32
}

}  // namespace
}  // namespace kvlm

namespace kvlm {
namespace {

// Generated text is valid UTF-8 however the model splits characters: a random synthetic model
// emits byte tokens that form no character, which once aborted `run --json` with a JSON
// exception; now they become U+FFFD and the output parses.
TEST(Cli, RunJsonOfARandomModelIsValidUtf8) {
  const std::string model = (testing::scratch_dir("cli_utf8") / "tiny.gguf").string();
  const auto s = run_command(kvlm_binary() + " synth --preset tiny-gqa --out " + model);
  ASSERT_EQ(s.exit_code, 0) << s.err;
  for (int seed : {1, 3, 5}) {
    const auto r = run_command(kvlm_binary() + " run -m " + model + " -n 30 --seed " + std::to_string(seed) +
                               " --json");
    ASSERT_EQ(r.exit_code, 0) << "seed " << seed << ": " << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);  // throws on invalid UTF-8
    EXPECT_TRUE(j.contains("text")) << r.out;
  }
}

}  // namespace
}  // namespace kvlm
