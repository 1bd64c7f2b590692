// The kvlm CLI's subcommands: each adds itself to the app and runs when chosen.
#pragma once

#include <CLI/CLI.hpp>

namespace kvlm::cli {

// Each returns the subcommand it registered; its callback throws CliError on failure.
CLI::App* add_run_command(CLI::App& app);
CLI::App* add_inspect_command(CLI::App& app);
CLI::App* add_convert_command(CLI::App& app);
CLI::App* add_synth_command(CLI::App& app);
CLI::App* add_quantize_command(CLI::App& app);
CLI::App* add_demo_command(CLI::App& app);
CLI::App* add_eval_command(CLI::App& app);
CLI::App* add_plan_command(CLI::App& app);
// Subcommands of `eval`, added by add_eval_command.
CLI::App* add_eval_stream_command(CLI::App* eval);
CLI::App* add_eval_recall_command(CLI::App* eval);
CLI::App* add_report_command(CLI::App& app);
CLI::App* add_bench_command(CLI::App& app);
CLI::App* add_bench_serve_command(CLI::App& app);
CLI::App* add_serve_command(CLI::App& app);
CLI::App* add_chat_command(CLI::App& app);

}  // namespace kvlm::cli
