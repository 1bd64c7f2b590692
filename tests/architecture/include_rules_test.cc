// The include rules of docs/ARCHITECTURE.md, enforced: every #include "x/..." in src/ and apps/
// against CMakeLists.txt's kvlm_module dependencies, and the doc's table against the same lists.
// Every module shares the include root src/, so without this test an upward include compiles.
#include "architecture/include_rules.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kvlm::architecture {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

const fs::path kRoot = KVLM_SOURCE_DIR;

std::string lines(const std::vector<std::string>& messages) {
  std::string out;
  for (const std::string& m : messages) out += "\n  " + m;
  return out;
}

ModuleTargets tree_targets() { return parse_cmake_modules(read_text(kRoot / "CMakeLists.txt")); }

std::set<std::string> names_of(const ModuleTargets& targets) {
  std::set<std::string> names;
  for (const auto& [name, t] : targets) names.insert(name);
  return names;
}

TEST(IncludeRules, EveryIncludeIsOneItsModuleMayMake) {
  const auto violations = include_violations(kRoot, tree_targets());
  EXPECT_THAT(violations, IsEmpty()) << "upward or unlisted includes:" << lines(violations);
}

TEST(IncludeRules, HeadersIncludeOnlyTheirModulesPublicDependencies) {
  const auto violations = public_header_violations(kRoot, tree_targets());
  EXPECT_THAT(violations, IsEmpty()) << lines(violations);
}

TEST(IncludeRules, EveryFolderUnderSrcIsAModule) {
  const ModuleTargets targets = tree_targets();
  for (const auto& entry : fs::directory_iterator(kRoot / "src")) {
    if (!entry.is_directory()) continue;
    const std::string name = entry.path().filename().string();
    EXPECT_TRUE(targets.contains(name)) << "src/" << name << "/ has no kvlm_module(" << name << ") in CMakeLists.txt";
  }
  for (const auto& [name, t] : targets) {
    EXPECT_TRUE(fs::is_directory(kRoot / t.folder)) << "kvlm_module(" << name << ") has no folder " << t.folder;
  }
}

TEST(IncludeRules, ArchitectureTableAgreesWithCMake) {
  const ModuleTargets targets = tree_targets();
  const auto rows = parse_doc_table(read_text(kRoot / "docs/ARCHITECTURE.md"), names_of(targets));
  ASSERT_FALSE(rows.empty()) << "no module table under \"## Modules and what each may include\"";
  const auto mismatches = doc_mismatches(rows, targets);
  EXPECT_THAT(mismatches, IsEmpty()) << lines(mismatches);
}

// The checkers themselves, on a tree made for them.

constexpr std::string_view kToyCmake = R"(
# kvlm_module(commented DEPS out) is no call
kvlm_module(core PUBLIC fmt::fmt)
kvlm_module(kv PUBLIC kvlm_core)
kvlm_module(model PUBLIC kvlm_core
                  PRIVATE kvlm_kv PkgConfig::PCRE2)
add_executable(kvlm ${app_sources})
target_link_libraries(kvlm PRIVATE kvlm_model CLI11::CLI11)
)";

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

TEST(IncludeRulesChecker, ReadsPublicPrivateAndTheExecutable) {
  const ModuleTargets t = parse_cmake_modules(kToyCmake);
  EXPECT_THAT(names_of(t), ElementsAre("apps", "core", "kv", "model"));
  EXPECT_THAT(t.at("model").public_deps, ElementsAre("core"));
  EXPECT_THAT(t.at("model").private_deps, ElementsAre("kv"));
  EXPECT_THAT(t.at("apps").deps(), ElementsAre("model"));
  EXPECT_EQ(t.at("apps").folder, "apps");
  const ModuleGraph closure = include_closure(all_deps(t));
  EXPECT_THAT(closure.at("apps"), ElementsAre("apps", "core", "kv", "model"));
  EXPECT_THAT(closure.at("core"), ElementsAre("core"));
  EXPECT_THROW(parse_cmake_modules("kvlm_module(x kvlm_core)\ntarget_link_libraries(kvlm PRIVATE kvlm_x)"),
               std::runtime_error);
}

TEST(IncludeRulesChecker, NamesTheFileAndLineOfAnUpwardInclude) {
  const fs::path root = fs::path(::testing::TempDir()) / "kvlm_include_rules_toy";
  fs::remove_all(root);
  write(root / "src/core/a.h", "#pragma once\n");
  write(root / "src/kv/b.cc", "#include \"kv/b.h\"\n#include \"core/a.h\"\n  #  include \"model/m.h\"\n");
  write(root / "src/kv/b.h", "// #include \"model/m.h\" in a comment is no include\n");
  write(root / "src/model/m.h", "#include \"core/a.h\"\n#include \"kv/b.h\"\n#include \"tools/x.h\"\n");
  write(root / "apps/main.cc", "#include \"cli.h\"\n#include \"kv/b.h\"\n");
  const ModuleTargets t = parse_cmake_modules(kToyCmake);
  const auto violations = include_violations(root, t);
  ASSERT_EQ(violations.size(), 2u) << lines(violations);
  EXPECT_THAT(violations[0], HasSubstr("src/kv/b.cc:3: kv includes \"model/m.h\", but kv may include only core, kv"));
  EXPECT_THAT(violations[1], HasSubstr("src/model/m.h:3: includes \"tools/x.h\", but 'tools' is no module"));
  // kv reaches model's users only through PRIVATE: its header including kv/ must make it PUBLIC.
  const auto headers = public_header_violations(root, t);
  ASSERT_EQ(headers.size(), 1u) << lines(headers);
  EXPECT_THAT(headers[0], HasSubstr("src/model/m.h:2: a header of model includes \"kv/b.h\""));
  EXPECT_THAT(headers[0], HasSubstr("PUBLIC in kvlm_module(model ...)"));
  fs::remove_all(root);
}

TEST(IncludeRulesChecker, ReadsTheTableAndNamesTheRowThatDisagrees) {
  const std::string doc = R"(# title
## Modules and what each may include
| module | holds | may include |
|---|---|---|
| `core/` | Status | nothing (fmt) |
| `kv/` | codecs | core |
| `model/` | the model | everything above |
| `apps/` | the CLI | model (types only) |

## Decisions
| `kv/` | not the table | model |
)";
  const ModuleTargets t = parse_cmake_modules(kToyCmake);
  const auto rows = parse_doc_table(doc, names_of(t));
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0].module, "core");
  EXPECT_THAT(rows[0].may_include, IsEmpty());
  EXPECT_THAT(rows[2].may_include, ElementsAre("core", "kv"));
  EXPECT_THAT(rows[3].may_include, ElementsAre("model"));
  EXPECT_EQ(rows[3].line, 8);
  EXPECT_THAT(doc_mismatches(rows, t), IsEmpty());

  std::vector<DocRow> wrong = rows;
  wrong[2].may_include = {"core"};  // the doc forgets model's kv
  const auto mismatches = doc_mismatches(wrong, t);
  ASSERT_EQ(mismatches.size(), 2u) << lines(mismatches);  // model's row and apps', which reaches kv through it
  EXPECT_THAT(mismatches[0], HasSubstr("docs/ARCHITECTURE.md:7: row `model/`"));
  EXPECT_THAT(mismatches[0], HasSubstr("only CMake: kv"));
  wrong.pop_back();
  EXPECT_THAT(doc_mismatches(wrong, t), ElementsAre(HasSubstr("no row `apps/`")));
}

}  // namespace
}  // namespace kvlm::architecture
