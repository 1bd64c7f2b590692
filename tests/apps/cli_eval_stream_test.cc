// End-to-end tests of `kvlm eval stream`: JSON segments on stories260K past its context, and one-line errors.
#include <algorithm>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/subprocess.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

using testing::kvlm_binary;
using testing::run_command;

int count_lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

TEST(CliEvalStream, JsonSegmentsRunPastTheTrainedContext) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  KVLM_REQUIRE_SHARED(text, "tinystories_valid_head.txt");
  const auto r = run_command(kvlm_binary() + " eval stream --model " + model.string() + " --text " + text.string() +
                             " --tokens 1200 --segment 256 --trained-ctx 512 --chunk 100 --threads 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["stream_tokens"].get<int>(), 1200);
  EXPECT_EQ(j["trained_ctx"].get<int>(), 512);
  EXPECT_EQ(j["gguf_context_length"].get<int>(), 2048);
  EXPECT_EQ(j["overall"]["tokens"].get<int>(), 1199);
  EXPECT_EQ(j["in_context"]["tokens"].get<int>(), 512);
  EXPECT_EQ(j["past_context"]["tokens"].get<int>(), 687);
  const auto& segments = j["segments"];
  ASSERT_EQ(segments.size(), 5u);  // 256 x 4 + 175 predictions
  const uint64_t bytes_per_block = j["kv_bytes_per_block"].get<uint64_t>();
  for (size_t k = 0; k < segments.size(); ++k) {
    const auto& s = segments[k];
    EXPECT_EQ(s["first_position"].get<int>(), 256 * static_cast<int>(k));
    EXPECT_EQ(s["past_context"].get<bool>(), k >= 2) << k;
    EXPECT_EQ(s["kv_bytes"].get<uint64_t>(), s["kv_blocks"].get<uint64_t>() * bytes_per_block);
    EXPECT_EQ(s["kv_blocks"].get<int>(), (s["end_position"].get<int>() + 15) / 16);
  }
  EXPECT_EQ(segments[4]["tokens"].get<int>(), 175);
  // The planner's prediction for the stream's peak matches the live pool.
  EXPECT_TRUE(j["kv_planner"]["agrees"].get<bool>()) << j["kv_planner"].dump();
  EXPECT_EQ(j["kv_planner"]["block_bytes"], j["kv_bytes_peak"]);
  // Inside the trained context stories260K predicts TinyStories well.
  EXPECT_GT(j["in_context"]["ppl"].get<double>(), 2.5);
  EXPECT_LT(j["in_context"]["ppl"].get<double>(), 6.0);
}

TEST(CliEvalStream, ShortTextAndBadSegmentGiveOneLineErrors) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  const auto path = testing::scratch_dir("cli_stream_short") / "short.txt";
  std::ofstream(path) << "Once upon a time there was a cat.";
  const std::string base = kvlm_binary() + " eval stream --model " + model.string() + " --text " + path.string();
  const auto s = run_command(base + " --tokens 500");
  EXPECT_EQ(s.exit_code, 1);
  EXPECT_EQ(count_lines(s.err), 1) << s.err;
  EXPECT_NE(s.err.find("--tokens 500"), std::string::npos) << s.err;
  EXPECT_NE(s.err.find("the text has"), std::string::npos) << s.err;
  const auto g = run_command(base + " --tokens 5 --segment 0");
  EXPECT_EQ(g.exit_code, 1);
  EXPECT_EQ(count_lines(g.err), 1) << g.err;
  EXPECT_NE(g.err.find("--segment"), std::string::npos) << g.err;
}

}  // namespace
}  // namespace kvlm
