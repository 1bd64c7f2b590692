// kvlm: the command-line entry point. Subcommands live in cmd_*.cc.
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "cli_error.h"
#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"kvlm: an LLM inference engine built around the KV cache"};
  app.require_subcommand(1);
  kvlm::cli::add_run_command(app);
  kvlm::cli::add_inspect_command(app);
  kvlm::cli::add_convert_command(app);
  kvlm::cli::add_synth_command(app);
  kvlm::cli::add_quantize_command(app);
  kvlm::cli::add_demo_command(app);
  kvlm::cli::add_eval_command(app);
  kvlm::cli::add_plan_command(app);
  kvlm::cli::add_report_command(app);
  kvlm::cli::add_bench_command(app);
  kvlm::cli::add_bench_serve_command(app);
  kvlm::cli::add_serve_command(app);
  kvlm::cli::add_chat_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    // One clear line, not CLI11's two-line default.
    std::fprintf(stderr, "kvlm: error: %s (see kvlm --help)\n", e.what());
    return 2;
  } catch (const kvlm::cli::CliError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "kvlm: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "kvlm: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
