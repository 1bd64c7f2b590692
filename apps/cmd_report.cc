// `kvlm report`: runs the matrix of KV options (codecs, and eviction policies at their budgets)
// through every instrument and writes report.md, report.json and PNG plots into a folder.
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "cli_error.h"
#include "model_source.h"
#include "commands.h"
#include "core/cpu_features.h"
#include "model/llama_model.h"
#include "report/report_config.h"
#include "report/report_markdown.h"
#include "report/report_plots.h"
#include "report/report_runner.h"
#include "text_file.h"

namespace kvlm::cli {
namespace {

struct ReportFlags {
  std::string model;
  std::string text;
  std::string out;
  std::string config = "full";
  size_t text_bytes = 100000;
  int threads = 0;
  int trained_ctx = 0;
  bool no_plots = false;
};

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", &tm);
  return buf;
}

void write_file(const std::filesystem::path& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary);
  out << content;
  if (!out) throw CliError(fmt::format("cannot write '{}'", path.string()));
}

void run(const ReportFlags& f) {
  namespace fs = std::filesystem;
  ReportConfig config = value_or_throw(report_config_named(f.config));
  if (f.trained_ctx < 0) throw CliError(fmt::format("--trained-ctx {} must be >= 0", f.trained_ctx));
  config.trained_ctx = f.trained_ctx;
  const std::string text = read_text_file(f.text, f.text_bytes);
  auto model = load_model_file(f.model);
  const Tokenizer& tok = model->tokenizer();
  const std::vector<TokenId> tokens = tok.encode(text, tok.add_bos());

  std::error_code ec;
  fs::create_directories(f.out, ec);
  if (ec || !fs::is_directory(f.out)) throw CliError(fmt::format("cannot create the output folder '{}'", f.out));

  ThreadPool pool(resolve_threads(f.threads));
  ReportData data = value_or_throw(run_report(*model, pool, tokens, config, [](const std::string& line) {
    std::fprintf(stderr, "report: %s\n", line.c_str());
  }));
  data.model.name = fs::path(f.model).filename().string();
  data.text_name = fs::path(f.text).filename().string() +
                   (f.text_bytes > 0 ? fmt::format(" (first {} bytes)", f.text_bytes) : std::string());
  data.date = utc_now();
  data.machine = fmt::format("{} threads, CPU features: {}", pool.num_threads(), cpu_features().summary());

  const fs::path json_path = fs::path(f.out) / "report.json";
  write_file(json_path, report_to_json(data).dump(2) + "\n");
  std::vector<std::string> plots;
  if (!f.no_plots) plots = value_or_throw(draw_report_plots(json_path.string(), f.out));
  const std::string command =
      fmt::format("kvlm report --model {} --text {} --config {} --text-bytes {}{} --out {}", data.model.name,
                  fs::path(f.text).filename().string(), f.config, f.text_bytes,
                  f.trained_ctx > 0 ? fmt::format(" --trained-ctx {}", f.trained_ctx) : std::string(), f.out);
  const fs::path md_path = fs::path(f.out) / "report.md";
  write_file(md_path, render_report_markdown(data, plots, command));
  std::printf("wrote %s, %s and %zu plots in %.1f s\n", md_path.c_str(), json_path.c_str(), plots.size(), data.seconds);
}

}  // namespace

CLI::App* add_report_command(CLI::App& app) {
  auto flags = std::make_shared<ReportFlags>();
  CLI::App* cmd = app.add_subcommand(
      "report", "Measure every KV option and eviction policy with every instrument; write report.md + plots");
  cmd->add_option("--model,-m", flags->model, "GGUF model file")->required();
  cmd->add_option("--text,-f", flags->text, "evaluation text file")->required();
  cmd->add_option("--out,-o", flags->out, "folder for report.md, report.json and the PNGs")->required();
  cmd->add_option("--config", flags->config, "full | quick (a small matrix for CI)")->capture_default_str();
  cmd->add_option("--text-bytes", flags->text_bytes, "use only the text's first N bytes; 0 = all")->capture_default_str();
  cmd->add_option("--threads,-t", flags->threads, "threads (default: all cores)");
  cmd->add_option("--trained-ctx", flags->trained_ctx,
                  "context the model was trained on, marked in the stream plot (default: the GGUF's)");
  cmd->add_flag("--no-plots", flags->no_plots, "skip the PNGs (no python3-matplotlib needed)");
  cmd->callback([flags] { run(*flags); });
  return cmd;
}

}  // namespace kvlm::cli
