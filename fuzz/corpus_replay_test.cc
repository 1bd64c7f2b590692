// Replays every file of fuzz/corpus/<target>/ (the seeds and every regression input found)
// through that target's entry point, in the normal test builds: a fixed crash stays fixed
// without libFuzzer. An empty or missing corpus directory fails: it would otherwise pass
// having replayed nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz/fuzz_targets.h"

namespace kvlm::fuzz {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> corpus_files(const std::string& target) {
  const fs::path dir = fs::path(KVLM_FUZZ_CORPUS_DIR) / target;
  std::vector<fs::path> files;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file()) files.push_back(it->path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<uint8_t> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class CorpusReplayTest : public ::testing::TestWithParam<FuzzTarget> {};

TEST_P(CorpusReplayTest, EveryCorpusFileRuns) {
  const FuzzTarget& target = GetParam();
  const std::vector<fs::path> files = corpus_files(target.name);
  ASSERT_FALSE(files.empty()) << "no corpus files in " << KVLM_FUZZ_CORPUS_DIR << "/" << target.name
                              << " (scripts/fuzz.sh --seed writes the seeds)";
  for (const fs::path& file : files) {
    SCOPED_TRACE(file.string());
    const std::vector<uint8_t> bytes = read_bytes(file);
    // A broken property aborts the process (KVLM_CHECK), which fails this test with the file named
    // on stderr by the trace below.
    fprintf(stderr, "replay %s\n", file.filename().c_str());
    EXPECT_EQ(target.one_input(bytes.data(), bytes.size()), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, CorpusReplayTest, ::testing::ValuesIn(kFuzzTargets),
                         [](const ::testing::TestParamInfo<FuzzTarget>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace kvlm::fuzz
