// The model file under kvlm's feet: weights are read where the file is mapped, so a file truncated
// on disk while kvlm runs makes the next read past its new end raise SIGBUS. The guard turns that
// into one line naming the file and a distinct exit code, never a bare "Bus error".
#pragma once

#include "gguf/gguf_file.h"

namespace kvlm::cli {

// kvlm's exit code when a mapped model file shrank under it (1 = error, 2 = usage).
inline constexpr int kExitModelFileChanged = 3;

// Remembers the file's mapped range and path and installs the SIGBUS handler (once). A SIGBUS at
// an address inside a guarded range writes "kvlm: error: the model file was truncated or changed
// on disk while mapped: PATH ..." to stderr and _exits with kExitModelFileChanged; any other
// SIGBUS keeps its default action. Files loaded from bytes (the embedded model) need no guard.
// Ranges stay guarded until exit: kvlm's commands keep their model to the end.
void guard_mapped_file(const GgufFile& file);

}  // namespace kvlm::cli
