// Renders a report's numbers as report.md.
#pragma once

#include <string>
#include <vector>

#include "report/report_data.h"

namespace kvlm {

// Markdown with one section per instrument: a table of the numbers and, when the plot's file
// name is in `plots` (names relative to the report's folder), the picture below it.
// `command` is the command line that reproduces the report.
std::string render_report_markdown(const ReportData& data, const std::vector<std::string>& plots,
                                   const std::string& command);

}  // namespace kvlm
