// Runs tests/chat/jinja_oracle.py (Debian's python3-jinja2, set up as Hugging Face does) on a
// batch of template + context cases: the oracle every chat test compares against.
#pragma once

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/subprocess.h"
#include "support/test_paths.h"

namespace kvlm::chat::testing {

inline constexpr const char* kOraclePython = "/usr/bin/python3";

struct OracleCase {
  std::string template_source;
  nlohmann::json context;
};

struct OracleResult {
  bool ok = false;
  std::string output;  // when ok
  std::string error;   // when not
};

// Why the oracle cannot run here, or nullopt when it can.
inline std::optional<std::string> oracle_unavailable() {
  if (!std::filesystem::exists(kOraclePython)) return std::string("/usr/bin/python3 not found");
  const auto probe = kvlm::testing::run_command(std::string(kOraclePython) + " -c 'import jinja2.sandbox'");
  if (probe.exit_code != 0) return std::string("python3-jinja2 not installed (apt-get install python3-jinja2)");
  return std::nullopt;
}

// One python process for the whole batch; results are in case order.
inline std::vector<OracleResult> run_oracle(const std::vector<OracleCase>& cases, const std::string& test_name) {
  nlohmann::json input = nlohmann::json::array();
  for (const OracleCase& c : cases) input.push_back({{"template", c.template_source}, {"context", c.context}});
  const std::filesystem::path dir = kvlm::testing::scratch_dir(test_name);
  const std::filesystem::path in_path = dir / "oracle_input.json";
  {
    std::ofstream out(in_path, std::ios::binary);
    out << input.dump(-1, ' ', /*ensure_ascii=*/true);
  }
  const std::string script = std::string(KVLM_SOURCE_DIR) + "/tests/chat/jinja_oracle.py";
  const auto run = kvlm::testing::run_command(std::string(kOraclePython) + " '" + script + "' < '" + in_path.string() + "'");
  std::vector<OracleResult> results;
  EXPECT_EQ(run.exit_code, 0) << run.err;
  if (run.exit_code != 0) return results;
  const nlohmann::json parsed = nlohmann::json::parse(run.out);
  for (const auto& r : parsed) {
    OracleResult result;
    result.ok = r.at("ok").get<bool>();
    if (result.ok) {
      result.output = r.at("output").get<std::string>();
    } else {
      result.error = r.at("error").get<std::string>();
    }
    results.push_back(std::move(result));
  }
  EXPECT_EQ(results.size(), cases.size());
  return results;
}

}  // namespace kvlm::chat::testing

#define KVLM_REQUIRE_JINJA_ORACLE()                                                     \
  if (auto why = ::kvlm::chat::testing::oracle_unavailable())                           \
  GTEST_SKIP() << "the jinja2 oracle is unavailable: " << *why

