#include "architecture/include_rules.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <iterator>
#include <regex>
#include <sstream>
#include <stdexcept>

namespace kvlm::architecture {
namespace {

namespace fs = std::filesystem;

// CMake text without its comments (nothing in kvlm's CMakeLists.txt quotes a '#').
std::string without_comments(std::string_view cmake) {
  std::string out;
  std::istringstream in{std::string(cmake)};
  for (std::string line; std::getline(in, line);) out += line.substr(0, line.find('#')) + "\n";
  return out;
}

std::vector<std::string> split_words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

// The arguments after the target name: PUBLIC / PRIVATE sections of kvlm_<module> targets.
void read_deps(const std::vector<std::string>& args, size_t first, const std::string& call, ModuleTarget& target) {
  std::set<std::string>* section = nullptr;
  for (size_t i = first; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "PUBLIC") {
      section = &target.public_deps;
    } else if (a == "PRIVATE") {
      section = &target.private_deps;
    } else if (section == nullptr) {
      throw std::runtime_error(call + ": '" + a + "' comes before PUBLIC or PRIVATE");
    } else if (a.starts_with("kvlm_")) {
      section->insert(a.substr(5));
    } else if (a.find("::") == std::string::npos) {
      throw std::runtime_error(call + ": '" + a + "' is neither a kvlm_ module nor a namespaced target");
    }
  }
}

std::string join(const std::set<std::string>& names) {
  if (names.empty()) return "nothing";
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::set<std::string> minus(const std::set<std::string>& a, const std::set<std::string>& b) {
  std::set<std::string> out;
  std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::inserter(out, out.end()));
  return out;
}

bool is_source(const fs::path& p) {
  const std::string ext = p.extension().string();
  return ext == ".h" || ext == ".cc" || ext == ".in";
}

bool is_header(const std::string& file) { return file.ends_with(".h") || file.ends_with(".in"); }

}  // namespace

std::set<std::string> ModuleTarget::deps() const {
  std::set<std::string> all = public_deps;
  all.insert(private_deps.begin(), private_deps.end());
  return all;
}

ModuleTargets parse_cmake_modules(std::string_view cmake) {
  const std::string text = without_comments(cmake);
  ModuleTargets targets;
  static const std::regex module_call(R"(kvlm_module\s*\(([^)]*)\))");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), module_call); it != std::sregex_iterator(); ++it) {
    const std::vector<std::string> args = split_words((*it)[1].str());
    if (args.empty()) throw std::runtime_error("kvlm_module() without a name");
    ModuleTarget t;
    t.name = args[0];
    t.folder = "src/" + args[0];
    read_deps(args, 1, "kvlm_module(" + args[0] + " ...)", t);
    if (!targets.emplace(t.name, t).second) throw std::runtime_error("kvlm_module(" + t.name + ") appears twice");
  }
  // The CLI: apps/ may include what the kvlm executable links.
  static const std::regex app_links(R"(target_link_libraries\s*\(\s*kvlm\s+([^)]*)\))");
  std::smatch m;
  if (!std::regex_search(text, m, app_links)) {
    throw std::runtime_error("no target_link_libraries(kvlm ...) for the kvlm executable");
  }
  ModuleTarget apps;
  apps.name = "apps";
  apps.folder = "apps";
  read_deps(split_words(m[1].str()), 0, "target_link_libraries(kvlm ...)", apps);
  targets.emplace(apps.name, apps);
  return targets;
}

ModuleGraph include_closure(const ModuleGraph& graph) {
  ModuleGraph closure;
  // Depth-first; `visiting` catches a cycle, which CMake would refuse for static libraries anyway.
  std::set<std::string> visiting;
  std::function<const std::set<std::string>&(const std::string&)> visit = [&](const std::string& m)
      -> const std::set<std::string>& {
    if (auto done = closure.find(m); done != closure.end()) return done->second;
    const auto node = graph.find(m);
    if (node == graph.end()) throw std::runtime_error("module '" + m + "' is listed but has no target");
    if (!visiting.insert(m).second) throw std::runtime_error("module '" + m + "' depends on itself");
    std::set<std::string> reach = {m};
    for (const std::string& dep : node->second) {
      const std::set<std::string>& sub = visit(dep);
      reach.insert(sub.begin(), sub.end());
    }
    visiting.erase(m);
    return closure[m] = std::move(reach);
  };
  for (const auto& [m, deps] : graph) visit(m);
  return closure;
}

ModuleGraph all_deps(const ModuleTargets& targets) {
  ModuleGraph g;
  for (const auto& [name, t] : targets) g[name] = t.deps();
  return g;
}

ModuleGraph public_deps(const ModuleTargets& targets) {
  ModuleGraph g;
  for (const auto& [name, t] : targets) g[name] = t.public_deps;
  return g;
}

std::vector<DocRow> parse_doc_table(std::string_view markdown, const std::set<std::string>& module_names) {
  std::vector<DocRow> rows;
  std::istringstream in{std::string(markdown)};
  bool in_section = false;
  int line_number = 0;
  static const std::regex word(R"([A-Za-z0-9_]+)");
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    if (line.starts_with("## ")) {
      in_section = line.starts_with("## Modules and what each may include");
      continue;
    }
    if (!in_section || !line.starts_with("| `")) continue;
    std::vector<std::string> cells;  // between the pipes: module, holds, may include
    std::istringstream row(line.substr(1));
    for (std::string cell; std::getline(row, cell, '|');) cells.push_back(cell);
    if (cells.size() < 3) continue;
    DocRow r;
    r.line = line_number;
    for (char c : cells.front()) {
      if (c != '`' && c != '/' && c != ' ') r.module += c;
    }
    const std::string& allowed = cells.back();
    if (allowed.find("everything above") != std::string::npos) {
      for (const DocRow& above : rows) r.may_include.insert(above.module);
    }
    for (auto it = std::sregex_iterator(allowed.begin(), allowed.end(), word); it != std::sregex_iterator(); ++it) {
      if (module_names.contains(it->str())) r.may_include.insert(it->str());
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

std::vector<IncludeLine> folder_includes(const fs::path& root, const std::string& folder) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::recursive_directory_iterator(root / folder)) {
    if (entry.is_regular_file() && is_source(entry.path())) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  static const std::regex include(R"re(^\s*#\s*include\s*"([^"/]+)/([^"]*)")re");
  std::vector<IncludeLine> lines;
  for (const fs::path& file : files) {
    std::istringstream in(read_text(file));
    int n = 0;
    for (std::string line; std::getline(in, line);) {
      ++n;
      std::smatch m;
      if (!std::regex_search(line, m, include)) continue;
      lines.push_back({.file = fs::relative(file, root).generic_string(),
                       .line = n,
                       .path = m[1].str() + "/" + m[2].str(),
                       .module = m[1].str()});
    }
  }
  return lines;
}

std::vector<std::string> include_violations(const fs::path& root, const ModuleTargets& targets) {
  const ModuleGraph allowed = include_closure(all_deps(targets));
  std::vector<std::string> out;
  for (const auto& [name, t] : targets) {
    const std::set<std::string>& may = allowed.at(name);
    for (const IncludeLine& inc : folder_includes(root, t.folder)) {
      if (!targets.contains(inc.module) || inc.module == "apps") {
        out.push_back(inc.file + ":" + std::to_string(inc.line) + ": includes \"" + inc.path + "\", but '" +
                      inc.module + "' is no module of CMakeLists.txt's kvlm_module calls");
      } else if (!may.contains(inc.module)) {
        out.push_back(inc.file + ":" + std::to_string(inc.line) + ": " + name + " includes \"" + inc.path +
                      "\", but " + name + " may include only " + join(may) +
                      " (CMakeLists.txt's dependencies of " + name + ", transitively)");
      }
    }
  }
  return out;
}

std::vector<std::string> public_header_violations(const fs::path& root, const ModuleTargets& targets) {
  const ModuleGraph allowed = include_closure(all_deps(targets));
  const ModuleGraph exported = include_closure(public_deps(targets));
  std::vector<std::string> out;
  for (const auto& [name, t] : targets) {
    if (name == "apps") continue;  // an executable has no users
    for (const IncludeLine& inc : folder_includes(root, t.folder)) {
      if (!is_header(inc.file) || !allowed.at(name).contains(inc.module)) continue;  // the other test's case
      if (exported.at(name).contains(inc.module)) continue;
      out.push_back(inc.file + ":" + std::to_string(inc.line) + ": a header of " + name + " includes \"" +
                    inc.path + "\", but " + name + " reaches kvlm_" + inc.module +
                    " only through PRIVATE dependencies: list it (or the dependency that brings it) as PUBLIC in "
                    "kvlm_module(" + name + " ...)");
    }
  }
  return out;
}

std::vector<std::string> doc_mismatches(const std::vector<DocRow>& rows, const ModuleTargets& targets) {
  std::vector<std::string> out;
  ModuleGraph doc_graph;
  for (const DocRow& r : rows) {
    if (!targets.contains(r.module)) {
      out.push_back("docs/ARCHITECTURE.md:" + std::to_string(r.line) + ": row `" + r.module +
                    "/` has no kvlm_module(" + r.module + ") in CMakeLists.txt");
    }
    doc_graph[r.module] = r.may_include;
  }
  for (const auto& [name, t] : targets) {
    if (!doc_graph.contains(name)) {
      out.push_back("docs/ARCHITECTURE.md: no row `" + name + "/` in the module table, but CMakeLists.txt builds it");
    }
  }
  if (!out.empty()) return out;
  const ModuleGraph doc = include_closure(doc_graph);
  const ModuleGraph cmake = include_closure(all_deps(targets));
  for (const DocRow& r : rows) {
    const std::set<std::string>& d = doc.at(r.module);
    const std::set<std::string>& c = cmake.at(r.module);
    if (d == c) continue;
    std::string message = "docs/ARCHITECTURE.md:" + std::to_string(r.line) + ": row `" + r.module +
                          "/` allows (with what those allow) " + join(d) + "; CMakeLists.txt allows " + join(c);
    if (const auto only_doc = minus(d, c); !only_doc.empty()) message += "; only the doc: " + join(only_doc);
    if (const auto only_cmake = minus(c, d); !only_cmake.empty()) message += "; only CMake: " + join(only_cmake);
    out.push_back(message);
  }
  return out;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace kvlm::architecture
