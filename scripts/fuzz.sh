#!/usr/bin/env bash
# libFuzzer targets (fuzz/): build with clang into build-fuzz, run, and keep the corpus.
#   scripts/fuzz.sh --list                 the targets
#   scripts/fuzz.sh NAME SECONDS [--merge] run one target for SECONDS; --merge adds the inputs that
#                                          found new coverage to fuzz/corpus/NAME (otherwise the live
#                                          corpus stays in a temp dir and the checked-in one is untouched)
#   scripts/fuzz.sh --smoke SECONDS        every target for SECONDS each (CI); fails on any finding
#   scripts/fuzz.sh --seed                 rewrite the seed files fuzz/corpus/*/seed_* (kvlm_fuzz_seed_corpus)
# A crash, leak or hang stops the run: its input is copied to fuzz/corpus/NAME/regression_* (so the
# replay test, kvlm_fuzz_replay_tests, fails until it is fixed) and the script exits 1.
# Env: KVLM_FUZZ_BUILD (default build-fuzz), KVLM_FUZZ_JOBS (build jobs, default 2).
set -euo pipefail
cd "$(dirname "$0")/.."

build="${KVLM_FUZZ_BUILD:-build-fuzz}"
jobs="${KVLM_FUZZ_JOBS:-2}"
targets=(gguf_reader tokenizer llama2c_converter chat_template openai_request engine_api)

# Longest input per target: room for its seeds, small enough to keep executions fast.
max_len() {
  case "$1" in
    gguf_reader) echo 65536 ;;
    llama2c_converter|chat_template) echo 16384 ;;
    openai_request) echo 8192 ;;
    tokenizer) echo 4096 ;;
    engine_api) echo 2048 ;;
  esac
}
# Seconds one input may take before it counts as a hang.
hang_seconds() {
  case "$1" in
    engine_api) echo 30 ;;
    *) echo 10 ;;
  esac
}

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

is_target() {
  local t
  for t in "${targets[@]}"; do [ "$t" = "$1" ] && return 0; done
  return 1
}

configure() {
  if [ ! -f "$build/build.ninja" ]; then
    cmake -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -gline-tables-only" -DKVLM_FUZZ=ON -DKVLM_BUILD_TESTS=OFF >/dev/null
  fi
}

# Quiet unless it fails: then the build's output and exit 1 (never a stale binary).
build_targets() {
  configure
  local log
  log="$(mktemp)"
  if ! cmake --build "$build" -j"$jobs" --target "$@" >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    echo "fuzz.sh: building $* failed" >&2
    exit 1
  fi
  rm -f "$log"
}

write_seeds() {
  build_targets kvlm_fuzz_seed_corpus
  ASAN_OPTIONS=detect_leaks=0 "$build/fuzz/kvlm_fuzz_seed_corpus" fuzz/corpus "$PWD"
}

# run NAME SECONDS MERGE: one libFuzzer process over a temp copy of the corpus.
run_target() {
  local name="$1" seconds="$2" merge="$3"
  local corpus="fuzz/corpus/$name"
  # The GGUF seeds are models, so git does not hold them: made here on a fresh checkout.
  if ! ls "$corpus"/seed_* >/dev/null 2>&1; then write_seeds; fi
  if [ -z "$(ls -A "$corpus" 2>/dev/null)" ]; then
    echo "fuzz.sh: $corpus is empty; run scripts/fuzz.sh --seed first" >&2
    exit 1
  fi
  local work
  work="$(mktemp -d "${TMPDIR:-/tmp}/kvlm_fuzz_${name}_XXXXXX")"
  mkdir -p "$work/live" "$work/artifacts"
  cp "$corpus"/* "$work/live/"
  local log="$work/fuzz.log" rc=0
  echo "== $name: ${seconds}s, max_len $(max_len "$name"), timeout $(hang_seconds "$name")s (log $log)"
  ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}" \
  UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}" \
    "$build/fuzz/kvlm_${name}_fuzz" "$work/live" -max_total_time="$seconds" -max_len="$(max_len "$name")" \
      -timeout="$(hang_seconds "$name")" -rss_limit_mb=4096 -print_final_stats=1 \
      -artifact_prefix="$work/artifacts/" >"$log" 2>&1 || rc=$?
  # The last status line carries coverage and corpus; the final stats the executions.
  local last execs rate
  last="$(grep -E '^#[0-9]+' "$log" | tail -1 || true)"
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
  rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)"
  echo "   $last"
  echo "   execs ${execs:-?}, exec/s ${rate:-?}, corpus files $(ls "$work/live" | wc -l)"
  local found=0 artifact
  for artifact in "$work/artifacts"/*; do
    [ -e "$artifact" ] || continue
    found=1
    local kept="$corpus/regression_$(basename "$artifact")"
    cp "$artifact" "$kept"
    echo "   FINDING: $(basename "$artifact") -> $kept"
  done
  if [ "$rc" -ne 0 ] || [ "$found" -ne 0 ]; then
    grep -E 'ERROR|Check failed|SUMMARY|==[0-9]+==|terminate' "$log" | head -20 >&2 || true
    echo "fuzz.sh: $name failed (exit $rc); full log: $log" >&2
    return 1
  fi
  if [ "$merge" = 1 ]; then
    "$build/fuzz/kvlm_${name}_fuzz" -merge=1 -max_len="$(max_len "$name")" "$corpus" "$work/live" >>"$log" 2>&1
    echo "   merged: $corpus has $(ls "$corpus" | wc -l) files"
  fi
  rm -rf "$work"
}

[ $# -ge 1 ] || usage
case "$1" in
  --list)
    printf '%s\n' "${targets[@]}"
    ;;
  --seed)
    write_seeds
    ;;
  --smoke)
    [ $# -eq 2 ] || usage
    bins=()
    for t in "${targets[@]}"; do bins+=("kvlm_${t}_fuzz"); done
    build_targets "${bins[@]}"
    failed=0
    for t in "${targets[@]}"; do run_target "$t" "$2" 0 || failed=1; done
    exit "$failed"
    ;;
  -*)
    usage
    ;;
  *)
    [ $# -ge 2 ] || usage
    is_target "$1" || { echo "fuzz.sh: unknown target '$1' (scripts/fuzz.sh --list)" >&2; exit 2; }
    merge=0
    [ "${3:-}" = "--merge" ] && merge=1
    build_targets "kvlm_$1_fuzz"
    run_target "$1" "$2" "$merge"
    ;;
esac
