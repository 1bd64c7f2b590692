#!/usr/bin/env bash
# A bounded, loopback-only load test of `kvlm serve` (the embedded stories260K model):
#   scripts/load-test.sh [SECONDS=60] [CLIENTS=64] [more load-test.mjs flags, e.g. --json --seed 7]
# Uses build/kvlm, or $KVLM. Exit 0 only when no request was lost and the server ended clean.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${1:-60}"
clients="${2:-64}"
shift $(( $# < 2 ? $# : 2 ))
kvlm="${KVLM:-$root/build/kvlm}"
if ! command -v node >/dev/null; then
  echo "load-test.sh: node is not installed (Node 18+ needed for fetch)" >&2
  exit 2
fi
if [[ ! -x "$kvlm" ]]; then
  echo "load-test.sh: no kvlm binary at $kvlm (build it, or set KVLM)" >&2
  exit 2
fi
exec node "$root/scripts/load-test.mjs" --kvlm "$kvlm" --seconds "$seconds" --clients "$clients" "$@"
