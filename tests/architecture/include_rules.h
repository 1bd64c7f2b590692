// Include rules: which module may include which, read from CMakeLists.txt (the one source the
// build uses) and docs/ARCHITECTURE.md, and the #include lines of the tree checked against them.
#pragma once

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace kvlm::architecture {

// One kvlm_module(name PUBLIC ... PRIVATE ...) call, or the kvlm executable (module "apps").
// Dependencies are module names ("kvlm_" dropped); third-party targets are left out.
struct ModuleTarget {
  std::string name;    // "eval"; "apps" for the kvlm executable
  std::string folder;  // "src/eval", "apps"
  std::set<std::string> public_deps;
  std::set<std::string> private_deps;

  std::set<std::string> deps() const;
};

using ModuleTargets = std::map<std::string, ModuleTarget>;
using ModuleGraph = std::map<std::string, std::set<std::string>>;  // module -> modules it names

// Every kvlm_module(...) call and the kvlm executable's target_link_libraries in CMakeLists.txt's
// text. Throws std::runtime_error naming the call it cannot read.
ModuleTargets parse_cmake_modules(std::string_view cmake);

// Module -> every module it may include: itself and, transitively, what its listed ones may.
// Throws std::runtime_error for a module listed that has no entry of its own.
ModuleGraph include_closure(const ModuleGraph& graph);

// The graph of every target's dependencies (deps()), and of its PUBLIC ones only.
ModuleGraph all_deps(const ModuleTargets& targets);
ModuleGraph public_deps(const ModuleTargets& targets);

// One row of docs/ARCHITECTURE.md's table under "## Modules and what each may include".
struct DocRow {
  std::string module;  // "eval" (the cell says `eval/`)
  int line = 0;        // 1-based line of the row in the file
  // Every module the "may include" cell names, parentheses included ("model (types only)" is
  // model); "everything above" is every module of the rows above it, "nothing (fmt)" is none.
  std::set<std::string> may_include;
};

// The table's rows; `module_names` are the words that count as modules in a cell.
std::vector<DocRow> parse_doc_table(std::string_view markdown, const std::set<std::string>& module_names);

// A quoted #include "x/..." line of the tree.
struct IncludeLine {
  std::string file;    // relative to the root: "src/kv/kv_storage.cc"
  int line = 0;        // 1-based
  std::string path;    // "model/llama_model.h"
  std::string module;  // "model": the first folder of the path
};

// Every #include "x/..." in the files (*.h, *.cc, *.in) under root/folder, in file and line order;
// includes without a folder (apps' "cli_error.h") are their own folder's and left out.
std::vector<IncludeLine> folder_includes(const std::filesystem::path& root, const std::string& folder);

// "file:line: ..." for every include of a module its target may not include (itself and the
// closure of its dependencies), or of a folder that is no module.
std::vector<std::string> include_violations(const std::filesystem::path& root, const ModuleTargets& targets);

// "file:line: ..." for every header (*.h, *.in) of a module that includes a module it reaches only
// through PRIVATE dependencies: users of the header would need it, so it must be PUBLIC.
std::vector<std::string> public_header_violations(const std::filesystem::path& root, const ModuleTargets& targets);

// One message per disagreement between the doc's table and the targets: a row or a target
// missing, or a row whose modules, closed over the table, differ from the target's closure.
std::vector<std::string> doc_mismatches(const std::vector<DocRow>& rows, const ModuleTargets& targets);

// A file's whole text; throws std::runtime_error naming it when it cannot be read.
std::string read_text(const std::filesystem::path& path);

}  // namespace kvlm::architecture
