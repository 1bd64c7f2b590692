// Runs llama.cpp's prebuilt llama-perplexity (shared/anchors/llama.cpp) on a file, as the CLI tests do.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace kvlm::testing {

// The anchor's llama-perplexity, or nullopt when shared/anchors/llama.cpp is absent.
std::optional<std::filesystem::path> llama_perplexity_binary();

// The running perplexity printed after `num_windows` windows ("[8]4194.3138,"), or nullopt.
std::optional<double> llama_window_ppl(const std::string& output, int num_windows);

struct LlamaPerplexityArgs {
  std::filesystem::path binary;  // llama_perplexity_binary()
  std::string model;
  std::filesystem::path text;
  int context = 128;
  int num_windows = 8;
  // One thread for tiny models: on a loaded 2-core machine, two threads' per-op barriers made a
  // 27-layer tiny deepseek2 file take 23-29 s instead of 0.6-0.9 s (same figures either way).
  int num_threads = 1;
  std::string extra_flags;
  bool expect_kld = false;  // extra_flags has --kl-divergence: its summary is the figure to read
};

// llama-perplexity --kl-divergence's summary: the mean per-token KL divergence from the
// baseline's distribution and how often both put the same token first.
struct LlamaKld {
  double mean = 0;
  double stderr_of_mean = 0;
  double same_top_percent = 0;
};

// Parses "Mean    KLD:   0.001087 ±   0.000014" and "Same top p: 95.623 ± 0.317 %", or nullopt.
std::optional<LlamaKld> llama_mean_kld(const std::string& output);

struct LlamaPerplexityRun {
  int exit_code = -1;
  std::string output;          // stdout and stderr of the last attempt
  std::optional<double> ppl;   // after num_windows windows (not printed with --kl-divergence)
  std::optional<LlamaKld> kld; // with --kl-divergence in extra_flags
};

// llama-perplexity -m model -f text -c context --chunks num_windows + 2 -t num_threads -ctk f32 -ctv f32
// -fa off extra_flags, with LD_LIBRARY_PATH at its folder. llama.cpp logs from a thread of its own that
// exit may cut short, so it runs two windows more than asked and again (up to 4 times) when the
// figure (or, with expect_kld, the KLD summary) was still lost; a run that fails (exit code not 0)
// is not repeated.
LlamaPerplexityRun run_llama_perplexity(const LlamaPerplexityArgs& args);

}  // namespace kvlm::testing
