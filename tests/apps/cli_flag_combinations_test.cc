// A flag that would do nothing beside the others given is a one-line error naming both flags and
// what to do, never silently ignored; the same flags where they do something still run, and a
// flag left at its default never triggers the error.
#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/subprocess.h"
#include "support/test_paths.h"

namespace kvlm {
namespace {

using testing::kvlm_binary;
using testing::run_command;

int count_lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

struct Rejected {
  std::string flags;
  std::vector<std::string> says;  // every piece must appear in the one-line error
};

void expect_rejected(const std::string& base, const std::vector<Rejected>& cases) {
  for (const Rejected& c : cases) {
    SCOPED_TRACE(c.flags);
    const auto r = run_command(base + " " + c.flags);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
    for (const std::string& piece : c.says) EXPECT_NE(r.err.find(piece), std::string::npos) << piece << " in " << r.err;
  }
}

void expect_accepted(const std::string& base, const std::vector<std::string>& flag_sets) {
  for (const std::string& flags : flag_sets) {
    SCOPED_TRACE(flags);
    const auto r = run_command(base + " " + flags);
    EXPECT_EQ(r.exit_code, 0) << r.err;
  }
}

TEST(CliFlagCombinations, RunRejectsEvictionFlagsThePolicyIgnores) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  const std::string base = kvlm_binary() + " run --model " + model.string() + " -n 2 --threads 1";
  expect_rejected(
      base,
      {{"--budget 64", {"--budget does nothing with --policy none", "drop --budget", "window, streaming, h2o or snapkv"}},
       {"--policy none --evict-step 2", {"--evict-step does nothing with --policy none"}},
       {"--policy h2o --budget 64 --sinks 2",
        {"--sinks does nothing with --policy h2o", "drop --sinks", "choose --policy streaming"}},
       {"--policy window --budget 64 --sinks 2", {"--sinks does nothing with --policy window"}},
       {"--policy streaming --budget 64 --h2o-recent 8",
        {"--h2o-recent does nothing with --policy streaming", "choose --policy h2o"}},
       {"--policy h2o --budget 64 --snapkv-window 8",
        {"--snapkv-window does nothing with --policy h2o", "choose --policy snapkv"}},
       {"--policy window --budget 64 --snapkv-kernel 3", {"--snapkv-kernel does nothing with --policy window"}},
       {"--sinks 4", {"--sinks does nothing with --policy none"}}});  // 4 is the default, but it was given
}

TEST(CliFlagCombinations, RunAcceptsEachPolicysOwnFlags) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  const std::string base = kvlm_binary() + " run --model " + model.string() + " -n 4 --temp 0 --threads 1";
  expect_accepted(base, {"--policy none", "--policy window --budget 64 --evict-step 2",
                         "--policy streaming --budget 64 --sinks 2 --evict-step 2",
                         "--policy h2o --budget 64 --h2o-recent 16",
                         "--policy snapkv --budget 64 --snapkv-window 8 --snapkv-kernel 3"});
}

TEST(CliFlagCombinations, RunRejectsKvFlagsNoCodecReads) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  const std::string base = kvlm_binary() + " run --model " + model.string() + " -n 2 --threads 1";
  expect_rejected(base,
                  {{"--kv-type f16 --kivi-residual 64",
                    {"--kivi-residual does nothing without a KIVI codec (K/V here: f16)", "drop --kivi-residual"}},
                   {"--kv-type-k int8 --kv-type-v f16 --kivi-residual 0", {"(K/V here: int8/f16)"}},
                   {"--kv-type int8 --kv-type-k f16 --kv-type-v f16",
                    {"--kv-type does nothing when --kv-type-k and --kv-type-v are both given", "drop --kv-type"}}});
  // A KIVI role on either side reads the window; one override leaves --kv-type the other side;
  // every K codec can be stored rotated.
  expect_accepted(base, {"--kv-type kivi4 --kivi-residual 32", "--kv-type-k f16 --kv-type-v kivi2 --kivi-residual 16",
                         "--kv-type int8 --kv-type-k f16", "--kv-type f16 --kv-rotate on",
                         "--kv-type kivi4 --kv-rotate off"});
}

TEST(CliFlagCombinations, RunRejectsSamplingFlagsGreedyIgnores) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  const std::string base = kvlm_binary() + " run --model " + model.string() + " -n 2 --threads 1";
  expect_rejected(base, {{"--temp 0 --top-k 5", {"--top-k does nothing with --temp 0", "drop --top-k", "--temp > 0"}},
                         {"--temp 0 --top-p 0.9", {"--top-p does nothing with --temp 0"}},
                         {"--temp=-1 --min-p 0.1", {"--min-p does nothing with --temp -1"}},
                         {"--temp 0 --seed 3", {"--seed does nothing with --temp 0"}},
                         {"--stats --json", {"--stats does nothing with --json", "drop --stats"}}});
  // The repetition penalty applies before the greedy pick; sampling reads every filter and the seed.
  expect_accepted(base, {"--temp 0 --repeat-penalty 1.1", "--temp 0.7 --top-k 5 --top-p 0.9 --min-p 0.1 --seed 3",
                         "--temp 0 --stats", "--temp 0 --json"});
}

TEST(CliFlagCombinations, EvalPplRejectsAPrefillChunkUnderAPolicy) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  KVLM_REQUIRE_SHARED(text, "tinystories_valid_head.txt");
  const std::string base = kvlm_binary() + " eval ppl --model " + model.string() + " --text " + text.string() +
                           " --ctx 64 --max-chunks 1 --threads 1";
  expect_rejected(base, {{"--policy window --budget 32 --prefill-chunk 16",
                          {"--prefill-chunk does nothing with --policy window", "drop --prefill-chunk"}},
                         {"--budget 32", {"--budget does nothing with --policy none"}},
                         {"--kv-type int4 --kivi-residual 16", {"--kivi-residual does nothing"}}});
  expect_accepted(base, {"--prefill-chunk 16", "--policy window --budget 32 --evict-step 4",
                         "--kv-type kivi2 --kivi-residual 16"});
}

TEST(CliFlagCombinations, EvalStreamAndRecallRejectFlagsTheirRequestIgnores) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  KVLM_REQUIRE_SHARED(text, "tinystories_valid_head.txt");
  const std::string stream = kvlm_binary() + " eval stream --model " + model.string() + " --text " + text.string() +
                             " --tokens 64 --segment 32 --threads 1";
  expect_rejected(stream, {{"--policy snapkv --budget 32 --snapkv-window 8 --h2o-recent 4",
                            {"--h2o-recent does nothing with --policy snapkv"}},
                           {"--kv-type fp8 --kivi-residual 16", {"--kivi-residual does nothing"}}});
  expect_accepted(stream, {"--policy streaming --budget 32 --sinks 2"});

  const std::string recall =
      kvlm_binary() + " eval recall --model " + model.string() + " --trials 1 --distances 0 --threads 1";
  expect_rejected(recall, {{"--mode passkey --span 8", {"--span does nothing with --mode passkey", "drop --span"}},
                           {"--mode passkey --spans random", {"--spans does nothing with --mode passkey"}},
                           {"--policy h2o --budget 64 --sinks 2", {"--sinks does nothing with --policy h2o"}}});
  expect_accepted(recall, {"--mode passkey", "--mode repeat --span 8 --spans random"});
}

TEST(CliFlagCombinations, PlanRejectsParamsWithAModelAndPolicyFlagsWithoutAPolicy) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  const std::string base = kvlm_binary() + " plan";
  expect_rejected(base, {{"--model " + model.string() + " --params 1e6",
                          {"--params does nothing with --model", "drop --params"}},
                         {"--preset llama-3-8b --sinks 8", {"--sinks does nothing with --policy none"}},
                         {"--preset llama-3-8b --policy window --budget 100 --sinks 8",
                          {"--sinks does nothing with --policy window", "choose --policy streaming"}}});
  expect_accepted(base, {"--preset llama-2-7b --params 7e9", "--model " + model.string(),
                         "--preset llama-3-8b --policy streaming --budget 4096 --sinks 8",
                         "--preset llama-3-8b --policy none"});
}

TEST(CliFlagCombinations, BenchRejectsFillAndPrefillChunkWhenNothingIsFilled) {
  KVLM_REQUIRE_SHARED(model, "stories260K.gguf");
  const std::string base = kvlm_binary() + " bench -m " + model.string() + " -r 1 -t 1";
  expect_rejected(
      base,
      {{"-p 8 -n 2 --fill random-kv", {"--fill does nothing with --n-depth 0", "drop --fill"}},
       {"-p 0 -n 2 --prefill-chunk 8", {"--prefill-chunk does nothing with --n-prompt 0 and no depth"}},
       {"-p 0 -n 2 -d 16 --fill random-kv --prefill-chunk 8",
        {"--prefill-chunk does nothing with --n-prompt 0 and --fill random-kv"}},
       {"-p 0 -n 2 --kv-type f16,int8 --kivi-residual 32", {"--kivi-residual does nothing", "(K/V here: f16, int8)"}},
       {"-p 0 -n 2 --kv-type f16,int8 --kv-type-k f16 --kv-type-v f16", {"--kv-type does nothing"}}});
  // --no-probe: the bandwidth probe (3 x 128+ MiB, seconds under ASan) is not what these check.
  expect_accepted(base + " --no-probe", {"-p 0 -n 2 -d 16 --fill random-kv", "-p 8 -n 0 --prefill-chunk 4",
                                         "-p 0 -n 2 -d 16 --fill model --prefill-chunk 8",
                                         "-p 0 -n 2 --kv-type f16,kivi4 --kivi-residual 32"});
}

}  // namespace
}  // namespace kvlm
