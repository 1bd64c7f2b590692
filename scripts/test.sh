#!/usr/bin/env bash
# Runs the whole test suite, in stages: the Release build's tests (all of them); the tests again
# under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan, clang, without the slow tests),
# a tree that also builds the libFuzzer targets, which then run a few seconds each from their
# corpora (fuzz-smoke); the engine and server concurrency tests under ThreadSanitizer
# (build-tsan). Each sanitized tree builds only what it runs.
# Prints the seconds each stage took at the end, also when a stage fails.
# Shared models are found via KVLM_SHARED or ../shared.
# Env: KVLM_FUZZ_SMOKE_SECONDS (seconds per fuzz target, default 10).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="$(nproc)"

timings=()
print_timings() {
  echo "== stage timings (s)"
  printf '%s\n' "${timings[@]}"
}
trap print_timings EXIT
stage() {  # stage NAME COMMAND...
  local name="$1" start=$SECONDS
  shift
  echo "== $name"
  "$@"
  timings+=("$(printf '%-16s %6d' "$name" $((SECONDS - start)))")
}

stage setup scripts/setup.sh
stage release-tests ctest --test-dir build --output-on-failure -j"$jobs"

# ASan + UBSan: the unit and integration tests (label `slow` is not built here). clang, so that
# the same tree builds the fuzz targets (KVLM_FUZZ: coverage hooks on the parsing and scheduling
# libraries only). -O1 with line tables (see CMakeLists.txt) and no bench or slow-test binary keep
# this build short. Each test binary runs as 6 gtest shards rather than a process per case (an
# ASan process start costs ~0.1 s; a failing case is named in its shard's output).
stage asan-build bash -c "cmake -B build-asan -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKVLM_SANITIZE=ON -DKVLM_FUZZ=ON -DKVLM_TEST_SHARDS=6 -DKVLM_BUILD_SLOW_TESTS=OFF -DKVLM_BUILD_BENCH=OFF >/dev/null \
  && cmake --build build-asan -j$jobs"
stage asan-tests env ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j"$jobs" -LE slow

# Fuzz smoke: every libFuzzer target for a few seconds from its corpus (seeds made on the spot,
# plus the checked-in regression inputs, which kvlm_fuzz_replay_tests also replays above). A
# crash, leak or hang fails the stage and leaves its input in fuzz/corpus/<target>/.
stage fuzz-smoke env KVLM_FUZZ_BUILD=build-asan KVLM_FUZZ_JOBS="$jobs" \
  scripts/fuzz.sh --smoke "${KVLM_FUZZ_SMOKE_SECONDS:-10}"

# ThreadSanitizer: the engine's threads tests and the server's tests, which drive them from many
# threads (submission and cancellation at once, clients leaving mid-stream). Any report fails the
# test; each runs three times, for more interleavings. scripts/tsan.supp says what is suppressed.
stage tsan-build bash -c "cmake -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVLM_TSAN=ON >/dev/null \
  && cmake --build build-tsan -j$jobs --target kvlm_engine_tests kvlm_server_tests"
stage tsan-tests env TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/scripts/tsan.supp" \
  ctest --test-dir build-tsan --output-on-failure -j"$jobs" -L 'engine|server' --repeat until-fail:3
