#!/usr/bin/env bash
# Runs the whole test suite: the Release build's tests, then the unit tests again under
# AddressSanitizer + UndefinedBehaviorSanitizer. Shared models are found via KVLM_SHARED or ../shared.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="$(nproc)"

scripts/setup.sh
ctest --test-dir build --output-on-failure -j"$jobs"

# Sanitizers: a separate build so the Release binaries stay fast.
cmake -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVLM_SANITIZE=ON
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j"$jobs" -LE slow
