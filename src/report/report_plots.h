// Draws a report's PNG plots by running the embedded plot_report.py under Debian's python3.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace kvlm {

// The python interpreter used: $KVLM_PYTHON when set, else /usr/bin/python3 (Debian's, where
// python3-matplotlib installs), else the first python3 on PATH.
std::string report_python();

// Runs the plotting script on `json_path`, writing PNGs into `out_dir`; returns the PNG file
// names (relative to out_dir) it wrote. An error names the interpreter and carries the script's
// stderr when python3 or matplotlib is missing or the script fails.
Result<std::vector<std::string>> draw_report_plots(const std::string& json_path, const std::string& out_dir);

}  // namespace kvlm
