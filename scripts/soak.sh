#!/usr/bin/env bash
# Soak benchmark: trains the default method for many steps and prints the
# process's resident memory after warm-up and at the end, and the growth in
# between (goal: under 5%). Not a test: a leak shows as steady growth.
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

warm=$((STEPS / 10)); warm_rss=""; last_rss=""; peak=0
while kill -0 "$pid" 2>/dev/null; do
  rss="$(rss_kb)"
  if [[ -n "$rss" ]]; then
    last_rss="$rss"; ((rss > peak)) && peak="$rss"
    if [[ -z "$warm_rss" ]] && (( $(steps_done) >= warm )); then warm_rss="$rss"; fi
  fi
  sleep 2
done
wait "$pid" || { echo "soak.sh: training failed, see $out/train.log" >&2; tail -5 "$out/train.log" >&2; exit 1; }
[[ -n "$warm_rss" ]] || { echo "soak.sh: the run ended before its warm-up" >&2; exit 1; }
echo "steps $STEPS, warm-up $warm steps; resident memory (MiB): after warm-up $((warm_rss / 1024)), at the end $((last_rss / 1024)), peak $((peak / 1024))"
awk -v a="$warm_rss" -v b="$last_rss" 'BEGIN { printf "growth after warm-up: %+.2f%% (goal: under 5%%)\n", 100 * (b - a) / a }'
echo "run directory: $out/run"
