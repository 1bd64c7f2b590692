// `kvlm quantize IN OUT --type q4_k_m`: a model's weight matrices in a llama.cpp-style mix.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli_error.h"
#include "commands.h"
#include "model/model_quantizer.h"

namespace kvlm::cli {
namespace {

struct QuantizeFlags {
  std::string in;
  std::string out;
  std::string type;
  int threads = 0;
  bool quiet = false;
};

void run(const QuantizeFlags& f) {
  QuantizeOptions options;
  options.in_path = f.in;
  options.out_path = f.out;
  options.mix = value_or_throw(parse_quant_mix(f.type));
  options.num_threads = f.threads;
  std::map<std::string, int> counts;  // type -> tensors
  const auto start = std::chrono::steady_clock::now();
  const bool show = !f.quiet && isatty(fileno(stderr)) == 1;
  options.progress = [&](size_t done, size_t total, const std::string& name, GgmlType type) {
    ++counts[std::string(ggml_type_name(type))];
    if (!show) return;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double eta = done > 0 ? s / static_cast<double>(done) * static_cast<double>(total - done) : 0.0;
    std::fprintf(stderr, "\r[%zu/%zu] %-28s %-7s %.1fs, ETA %.0fs   ", done, total, name.c_str(),
                 std::string(ggml_type_name(type)).c_str(), s, eta);
    if (done == total) std::fputc('\n', stderr);
  };
  throw_if_error(quantize_model(options));
  std::string mix;
  for (const auto& [type, n] : counts) mix += fmt::format("{}{} x{}", mix.empty() ? "" : ", ", type, n);
  std::printf("wrote %s: %s (%s)\n", f.out.c_str(), options.mix.name.c_str(), mix.c_str());
}

}  // namespace

CLI::App* add_quantize_command(CLI::App& app) {
  auto flags = std::make_shared<QuantizeFlags>();
  CLI::App* cmd = app.add_subcommand("quantize", "Rewrite an F32/F16/BF16 model's weights in a quantization mix");
  cmd->add_option("input", flags->in, "GGUF model (F32, F16 or BF16 weights)")->required();
  cmd->add_option("output", flags->out, "GGUF file to write")->required();
  cmd->add_option("--type,-t", flags->type, fmt::format("mix: {}", fmt::join(quant_mix_names(), ", ")))->required();
  cmd->add_option("--threads", flags->threads, "threads (default: all cores)");
  cmd->add_flag("--quiet,-q", flags->quiet, "no progress on stderr");
  cmd->callback([flags] { run(*flags); });
  return cmd;
}

}  // namespace kvlm::cli
