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
    if (run.ppl || r.exit_code != 0) break;
  }
  return run;
}

}  // namespace kvlm::testing
