#!/usr/bin/env bash
# The soak (issue 16): MINUTES of mixed load on loopback against `kvlm serve` (the embedded
# stories260K): short and long prompts, shared prefixes, streaming and whole answers, n > 1,
# eviction policies, cancellations, connections dropped mid-stream and mid-request, invalid
# requests, and a pool small enough that long prompts force preemption. Afterwards: the server
# answers and still generates, holds no KV blocks, runs nothing, exits 0 on SIGTERM, and its
# resident memory grew less than 5% after the warm-up (a fifth of the run, at most 5 minutes).
#   scripts/soak.sh MINUTES [CLIENTS=48] [more load-test.mjs flags, e.g. --json --seed 7]
# Uses build/kvlm, or $KVLM. Exit 0 only when every check holds; the last line is the summary.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
if [[ $# -lt 1 || ! "$1" =~ ^[0-9]+([.][0-9]+)?$ ]]; then
  sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
minutes="$1"
shift
clients=48
if [[ $# -gt 0 && "$1" =~ ^[0-9]+$ ]]; then
  clients="$1"
  shift
fi
seconds="$(awk -v m="$minutes" 'BEGIN { printf "%d", m * 60 }')"
# 64 blocks x 16 tokens: two long prompts (500-1100 tokens) fill it, so preemption is routine.
# load-test.sh finds node and the kvlm binary (build/kvlm, or $KVLM).
exec "$root/scripts/load-test.sh" "$seconds" "$clients" \
  --pool-blocks 64 --max-seqs 24 --max-queue 48 --rss-growth-limit 5 --request-timeout 120 "$@"
