#!/usr/bin/env bash
# Soak benchmark: trains the default method for many steps, samples the
# process's resident memory once a second, and prints it after warm-up and
# before the last step, the growth in between (goal: under 5%) and its
# trend per 1000 steps. Not a test: a leak shows as steady growth.
#
#   scripts/soak.sh [STEPS] [-- extra sparsecomm train arguments]
#
# Defaults: 10000 steps of `sparsecomm train` (ExDyna 1%, 4 thread ranks,
# the CNN), evaluated every 2000 steps; warm-up: the first 10% of the steps.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${SPARSECOMM_BIN:-$ROOT/build/sparsecomm}"
STEPS="${1:-10000}"
[[ "$STEPS" =~ ^[0-9]+$ ]] && ((STEPS >= 100)) || { echo "soak.sh: STEPS must be a number >= 100" >&2; exit 2; }
shift || true
[[ "${1:-}" == "--" ]] && shift
[[ -x "$BIN" ]] || { echo "soak.sh: $BIN is missing; run scripts/setup.sh first" >&2; exit 1; }

out="$(mktemp -d /tmp/sparsecomm-soak.XXXXXX)"
"$BIN" train --max-steps "$STEPS" --eval-every 2000 --no-plots --out "$out/run" "$@" \
  >"$out/train.log" 2>&1 &
pid=$!
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$pid/status" 2>/dev/null || true; }
steps_done() { grep -c '"kind":"step"' "$out/run/metrics.jsonl" 2>/dev/null || echo 0; }

# One sample a second: steps done and resident KiB (samples.tsv).
warm=$((STEPS / 10))
: >"$out/samples.tsv"
while kill -0 "$pid" 2>/dev/null; do
  rss="$(rss_kb)"
  [[ -n "$rss" ]] && printf '%s\t%s\n' "$(steps_done)" "$rss" >>"$out/samples.tsv"
  sleep 1
done
wait "$pid" || { echo "soak.sh: training failed, see $out/train.log" >&2; tail -5 "$out/train.log" >&2; exit 1; }
# After warm-up and before the last step (the end of the run adds a final
# evaluation, the summary and the plots): the first and the last sample,
# the peak, and the least-squares slope of RSS against steps, which a leak
# in the step loop makes positive and steady (an evaluation only lifts the
# samples taken while it runs).
awk -v warm="$warm" -v steps="$STEPS" '
  $1 >= warm && $1 < steps {
    if (n == 0) first = $2
    last = $2; if ($2 > peak) peak = $2
    n++; sx += $1; sy += $2; sxx += $1 * $1; sxy += $1 * $2
  }
  END {
    if (n < 3) { print "soak.sh: too few samples after the warm-up" > "/dev/stderr"; exit 1 }
    slope = (n * sxy - sx * sy) / (n * sxx - sx * sx)   # KiB per step
    printf "steps %d, warm-up %d steps, %d samples after it; resident memory (MiB): after warm-up %d, before the last step %d, peak %d\n", steps, warm, n, first / 1024, last / 1024, peak / 1024
    printf "growth after warm-up: %+.2f%% (goal: under 5%%); trend %+.2f MiB per 1000 steps\n", 100 * (last - first) / first, slope * 1000 / 1024
  }' "$out/samples.tsv"
echo "run directory: $out/run (samples: $out/samples.tsv)"
