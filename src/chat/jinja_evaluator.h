// JinjaEvaluator: renders a parsed template against a context, with jinja2's scoping
// (a fresh scope per loop iteration, macros and with blocks; `if` shares its scope) and
// caps on output size, loop iterations and call depth.
#pragma once

#include <string>

#include "chat/jinja_ast.h"
#include "chat/jinja_value.h"
#include "core/status.h"

namespace kvlm::chat {

struct JinjaRenderLimits {
  size_t max_output_bytes = size_t{16} << 20;
  int64_t max_loop_iterations = 1'000'000;  // all loops of one render together
  int max_call_depth = 64;                  // nested macro calls
};

// `context` must be a dict: its keys are the template's variables.
Result<std::string> render_template(const StmtList& body, std::string_view source, const JinjaValue& context,
                                    const JinjaRenderLimits& limits = {});

}  // namespace kvlm::chat
