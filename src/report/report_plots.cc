#include "report/report_plots.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "report/plot_report_script.h"

namespace kvlm {
namespace {

// Single quotes for /bin/sh, with embedded single quotes closed, escaped and reopened.
std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string read_all(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::string report_python() {
  if (const char* env = std::getenv("KVLM_PYTHON"); env != nullptr && *env != '\0') return env;
  if (::access("/usr/bin/python3", X_OK) == 0) return "/usr/bin/python3";
  return "python3";
}

Result<std::vector<std::string>> draw_report_plots(const std::string& json_path, const std::string& out_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path tmp = fs::temp_directory_path(ec);
  if (ec) return Status::errorf("no temporary folder for the plotting script: {}", ec.message());
  const std::string stem = fmt::format("kvlm-plot-{}", ::getpid());
  const fs::path script = tmp / (stem + ".py");
  const fs::path errors = tmp / (stem + ".err");
  {
    std::ofstream out(script, std::ios::binary);
    out << kPlotReportScript;
    if (!out) return Status::errorf("cannot write the plotting script to '{}'", script.string());
  }
  const std::string python = report_python();
  const std::string command = fmt::format("{} {} {} {} 2>{}", shell_quote(python), shell_quote(script.string()),
                                          shell_quote(json_path), shell_quote(out_dir), shell_quote(errors.string()));
  std::FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return Status::errorf("cannot start '{}' to draw the plots", python);
  std::vector<std::string> written;
  char line[4096];
  while (std::fgets(line, sizeof line, pipe) != nullptr) {
    std::string path(line);
    while (!path.empty() && (path.back() == '\n' || path.back() == '\r')) path.pop_back();
    if (!path.empty()) written.push_back(fs::path(path).filename().string());
  }
  const int status = ::pclose(pipe);
  const std::string stderr_text = read_all(errors);
  fs::remove(script, ec);
  fs::remove(errors, ec);
  if (status != 0) {
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return Status::errorf("drawing the plots with '{}' failed (exit {}){}{}", python, code,
                          stderr_text.empty() ? "" : ": ", stderr_text.substr(0, 2000));
  }
  return written;
}

}  // namespace kvlm
