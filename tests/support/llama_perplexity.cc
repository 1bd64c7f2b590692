#include "support/llama_perplexity.h"

#include <regex>

#include <fmt/format.h>

#include "support/subprocess.h"
#include "support/test_paths.h"

namespace kvlm::testing {

std::optional<std::filesystem::path> llama_perplexity_binary() { return shared_anchor("llama.cpp/llama-perplexity"); }

std::optional<double> llama_window_ppl(const std::string& output, int num_windows) {
  std::smatch m;
  const std::regex window("\\[" + std::to_string(num_windows) + R"(\](-?[0-9.]+|-?nan|-?inf))");
  if (!std::regex_search(output, m, window)) return std::nullopt;
  return std::stod(m[1].str());
}

std::optional<LlamaKld> llama_mean_kld(const std::string& output) {
  std::smatch mean;
  std::smatch top;
  const std::regex mean_line(R"(Mean\s+KLD:\s+([0-9.eE+-]+)\s+±\s+([0-9.eE+-]+))");
  const std::regex top_line(R"(Same top p:\s+([0-9.]+)\s+±)");
  if (!std::regex_search(output, mean, mean_line) || !std::regex_search(output, top, top_line)) return std::nullopt;
  return LlamaKld{std::stod(mean[1].str()), std::stod(mean[2].str()), std::stod(top[1].str())};
}

LlamaPerplexityRun run_llama_perplexity(const LlamaPerplexityArgs& a) {
  LlamaPerplexityRun run;
  for (int attempt = 0; attempt < 4; ++attempt) {
    const CommandResult r = run_command(fmt::format(
        "LD_LIBRARY_PATH={} {} -m {} -f {} -c {} --chunks {} -t {} -ctk f32 -ctv f32 -fa off {}",
        a.binary.parent_path().string(), a.binary.string(), a.model, a.text.string(), a.context, a.num_windows + 2,
        a.num_threads, a.extra_flags));
    run.exit_code = r.exit_code;
    run.output = r.out + r.err;
    run.ppl = llama_window_ppl(run.output, a.num_windows);
    run.kld = llama_mean_kld(run.output);
    // In --kl-divergence mode llama-perplexity prints a table instead of the running "[n]ppl".
    const bool complete = a.expect_kld ? run.kld.has_value() : run.ppl.has_value();
    if (complete || r.exit_code != 0) break;
  }
  return run;
}

}  // namespace kvlm::testing
