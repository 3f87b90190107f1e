#!/usr/bin/env bash
# Records real gradient traces for `sparsecomm bench sparsifiers --trace DIR`:
# for each model and rank count it runs
#   sparsecomm train -m dense --model M -n R --max-steps T \
#                    --record-gradients OUT/M-nR-tT --record-steps T
# (char-lstm on --dataset fortunes, the others on Fashion-MNIST), so that
# the run stops right after the last recorded step. Evaluation is cut to a
# few test samples (--test-samples) and no plots are drawn; the run's own
# directory (config.json, metrics.jsonl, summary.json) and log go to
# OUT/runs/M-nR-tT/. Each recording is timed (printed and appended to
# OUT/timings.tsv).
#
# Usage: scripts/record-traces.sh [OPTIONS] [OUT] [-- EXTRA TRAIN FLAGS]
#   OUT               output directory (default /tmp/sparsecomm-traces,
#                     or $TRACE_DIR); keep it outside the repository:
#                     traces are never committed
#   --models LIST     comma-separated models (default cnn,mlp,char-lstm,
#                     or $MODELS)
#   --ranks LIST      comma-separated thread-rank counts (default 4,16,
#                     or $RANKS)
#   --steps T         recorded steps = total steps (default 300, or $STEPS)
#   --margin-mb MB    free disk kept beyond each trace (default 2048,
#                     or $MARGIN_MB)
#   --test-samples N  test samples per evaluation (default 256, or
#                     $TEST_SAMPLES; does not change the gradients)
#   -- FLAGS          passed on to every `sparsecomm train`
# Environment: SPARSECOMM, the binary (default build/sparsecomm under the
# repository root).
#
# Disk: a trace is ranks x steps x d x 4 bytes (d: cnn 421,642, mlp
# 235,146, char-lstm 360,865 parameters; other models are probed with a
# one-step run). The defaults need about 24.4 GB (2.0 + 8.1 GB cnn,
# 1.1 + 4.5 GB mlp, 1.7 + 6.9 GB char-lstm). Before each recording the
# script checks the free space (df) of OUT against the trace's size plus
# the margin and stops with a message if it is short.
#
# Rerunnable: a trace whose meta.json exists and whose rank<r>.f32 files
# all have their full size is skipped. meta.json is written when a
# recording starts, so a trace left incomplete by an interrupted run
# (rank files short or missing) is recorded again.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

BIN="${SPARSECOMM:-$ROOT/build/sparsecomm}"
OUT="${TRACE_DIR:-/tmp/sparsecomm-traces}"
MODELS="${MODELS:-cnn,mlp,char-lstm}"
RANKS="${RANKS:-4,16}"
STEPS="${STEPS:-300}"
MARGIN_MB="${MARGIN_MB:-2048}"
TEST_SAMPLES="${TEST_SAMPLES:-256}"
EXTRA=()

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "record-traces: $*" >&2; exit 1; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --models) MODELS="${2:?--models needs a list}"; shift 2 ;;
    --ranks) RANKS="${2:?--ranks needs a list}"; shift 2 ;;
    --steps) STEPS="${2:?--steps needs a number}"; shift 2 ;;
    --margin-mb) MARGIN_MB="${2:?--margin-mb needs a number}"; shift 2 ;;
    --test-samples) TEST_SAMPLES="${2:?--test-samples needs a number}"; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *) OUT="$1"; shift ;;
  esac
done

[[ -x "$BIN" ]] || die "no executable sparsecomm at '$BIN' (build it, or set SPARSECOMM)"
[[ "$STEPS" =~ ^[1-9][0-9]*$ ]] || die "--steps must be a positive integer, got '$STEPS'"
[[ "$MARGIN_MB" =~ ^[0-9]+$ ]] || die "--margin-mb must be a non-negative integer, got '$MARGIN_MB'"
[[ "$TEST_SAMPLES" =~ ^[1-9][0-9]*$ ]] || die "--test-samples must be a positive integer"
IFS=',' read -r -a MODEL_LIST <<<"${MODELS// /,}"
IFS=',' read -r -a RANK_LIST <<<"${RANKS// /,}"
for r in "${RANK_LIST[@]}"; do
  [[ -z "$r" || "$r" =~ ^[1-9][0-9]*$ ]] || die "ranks must be positive integers, got '$r'"
done

mkdir -p "$OUT/runs"
OUT="$(cd "$OUT" && pwd)"

# Flags that pick a model's dataset.
dataset_flags() {
  case "$1" in
    char-lstm) echo "--dataset fortunes" ;;
    *) echo "" ;;
  esac
}

# d, the model's parameter count: known ones, else from a one-step run's
# header line ("... N parameters ...").
numel_of() {
  case "$1" in
    cnn) echo 421642 ;;
    mlp) echo 235146 ;;
    char-lstm) echo 360865 ;;
    *)
      local probe d
      probe="$(mktemp -d "$OUT/.probe-XXXXXX")"
      # shellcheck disable=SC2046
      d="$("$BIN" train --model "$1" $(dataset_flags "$1") -m dense -n 1 --max-steps 1 \
             --test-samples 1 --no-plots --out "$probe/run" 2>&1 |
           sed -n 's/.* \([0-9][0-9]*\) parameters.*/\1/p' | head -n 1)" || true
      rm -rf "$probe"
      [[ -n "$d" ]] || die "cannot find the parameter count of model '$1'"
      echo "$d"
      ;;
  esac
}

# Succeeds if DIR holds a whole trace of WORLD ranks x STEPS steps x D floats.
trace_complete() {
  local dir="$1" world="$2" steps="$3" d="$4" r size
  [[ -f "$dir/meta.json" ]] || return 1
  grep -Eq "\"world\": *$world\b" "$dir/meta.json" || return 1
  grep -Eq "\"steps\": *$steps\b" "$dir/meta.json" || return 1
  grep -Eq "\"numel\": *$d\b" "$dir/meta.json" || return 1
  for ((r = 0; r < world; r++)); do
    size="$(stat -c %s "$dir/rank$r.f32" 2>/dev/null)" || return 1
    [[ "$size" -eq $((steps * d * 4)) ]] || return 1
  done
}

human() { awk -v b="$1" 'BEGIN { printf "%.2f GB", b / 1e9 }'; }

TIMINGS="$OUT/timings.tsv"
[[ -f "$TIMINGS" ]] || printf 'trace\tmodel\tranks\tsteps\td\tbytes\tseconds\n' >"$TIMINGS"

for model in "${MODEL_LIST[@]}"; do
  [[ -n "$model" ]] || continue
  d="$(numel_of "$model")"
  for ranks in "${RANK_LIST[@]}"; do
    [[ -n "$ranks" ]] || continue
    name="$model-n$ranks-t$STEPS"
    dir="$OUT/$name"
    bytes=$((ranks * STEPS * d * 4))
    if trace_complete "$dir" "$ranks" "$STEPS" "$d"; then
      echo "[$name] complete trace in $dir, skipped"
      continue
    fi
    if [[ -f "$dir/meta.json" ]]; then
      echo "[$name] $dir/meta.json exists but the trace is incomplete: recording it again"
    fi
    avail=$(($(df -Pk "$OUT" | awk 'NR == 2 { print $4 }') * 1024))
    need=$((bytes + MARGIN_MB * 1024 * 1024))
    if ((avail < need)); then
      die "[$name] needs $(human "$bytes") ($ranks ranks x $STEPS steps x d=$d x 4 B) plus a" \
          "${MARGIN_MB} MB margin, but only $(human "$avail") is free on $(df -P "$OUT" |
          awk 'NR == 2 { print $6 }'): free some space, pick another OUT, or lower --steps/--ranks"
    fi
    mkdir -p "$dir"
    run_dir="$OUT/runs/$name"
    rm -rf "$run_dir"
    mkdir -p "$run_dir"
    echo "[$name] recording $(human "$bytes") (d=$d) into $dir"
    start="$(date +%s.%N)"
    # shellcheck disable=SC2046
    "$BIN" train --model "$model" $(dataset_flags "$model") -m dense -n "$ranks" \
      --max-steps "$STEPS" --record-gradients "$dir" --record-steps "$STEPS" \
      --test-samples "$TEST_SAMPLES" --no-plots --out "$run_dir" ${EXTRA[@]+"${EXTRA[@]}"} \
      2>&1 | tee "$run_dir.log"
    seconds="$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')"
    trace_complete "$dir" "$ranks" "$STEPS" "$d" ||
      die "[$name] the run ended but $dir is not a complete trace of d=$d (see $run_dir.log)"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$model" "$ranks" "$STEPS" "$d" "$bytes" \
      "$seconds" >>"$TIMINGS"
    echo "[$name] done in ${seconds} s"
  done
done
echo "traces in $OUT (timings: $TIMINGS)"
