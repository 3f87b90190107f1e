#!/usr/bin/env bash
# Time to accuracy on an emulated cluster (scripts/emulated-cluster.sh): each
# model is trained with each method for the same number of epochs, with
# evaluation off the clock (--eval-deferred), then `sparsecomm report
# --target-drop` prints the seconds each run took to reach the first run's
# (dense's) final test accuracy minus a margin. Needs root.
#
#   scripts/time-to-accuracy.sh OUT [options]
#     --rate 1gbit            link rate (each direction of each host)
#     --hosts 4
#     --models "wide-mlp cnn"
#     --methods "dense skipreduce topk micro exdyna deft"   dense first: the target
#     --epochs 3
#     --eval-every 40         evaluation points (steps) for the time resolution
#     --drop 0.5              target = dense's final accuracy minus this (points)
#
# Resumable: a run (OUT/<model>/<method>) whose summary.json exists is skipped.
# Every run uses batch 64 per rank, c = 1%, seed 42 and the MPI backend.
# SPARSECOMM_BIN=PATH runs another binary than build/sparsecomm (a copy keeps
# a long run independent of rebuilds).
set -euo pipefail

usage() { sed -n '2,18p' "$0" >&2; exit 2; }
(($# >= 1)) || usage
OUT=$1
shift
RATE=1gbit
HOSTS=4
MODELS="wide-mlp cnn"
METHODS="dense skipreduce topk micro exdyna deft"
EPOCHS=3
EVAL_EVERY=40
DROP=0.5
while (($# > 0)); do
  (($# >= 2)) || { echo "time-to-accuracy: $1 needs a value" >&2; usage; }
  case $1 in
    --rate) RATE=$2 ;;
    --hosts) HOSTS=$2 ;;
    --models) MODELS=$2 ;;
    --methods) METHODS=$2 ;;
    --epochs) EPOCHS=$2 ;;
    --eval-every) EVAL_EVERY=$2 ;;
    --drop) DROP=$2 ;;
    *) echo "time-to-accuracy: unknown option '$1'" >&2; usage ;;
  esac
  shift 2
done
for value in "$HOSTS" "$EPOCHS" "$EVAL_EVERY"; do
  [[ $value =~ ^[1-9][0-9]*$ ]] ||
    { echo "time-to-accuracy: --hosts, --epochs and --eval-every take positive integers, got '$value'" >&2; exit 2; }
done

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${SPARSECOMM_BIN:-$ROOT/build/sparsecomm}
CLUSTER=$ROOT/scripts/emulated-cluster.sh
[[ -x $BIN ]] || { echo "time-to-accuracy: build first ($BIN is missing)" >&2; exit 1; }
mkdir -p "$OUT"
trap '"$CLUSTER" down' EXIT
"$CLUSTER" down
"$CLUSTER" up "$HOSTS" "$RATE"

for model in $MODELS; do
  for method in $METHODS; do
    dir=$OUT/$model/$method
    [[ -f $dir/summary.json ]] && continue
    rm -rf "$dir" && mkdir -p "$OUT/$model"
    echo "time-to-accuracy: $model, $method ($(date +%T))"
    "$CLUSTER" run "$HOSTS" "$BIN" train --backend mpi -n "$HOSTS" --model "$model" -m "$method" \
      -d 0.01 --batch 64 --seed 42 --epochs "$EPOCHS" --eval-every "$EVAL_EVERY" --eval-deferred \
      --out "$dir" > "$dir.log" 2>&1 || echo "time-to-accuracy: $model $method failed (see $dir.log)"
  done
done

for model in $MODELS; do
  runs=()
  for method in $METHODS; do
    [[ -f $OUT/$model/$method/summary.json ]] && runs+=("$OUT/$model/$method")
  done
  ((${#runs[@]} > 0)) || continue
  echo "== $model, $HOSTS hosts at $RATE, $EPOCHS epochs"
  "$BIN" report --no-plots --target-drop "$DROP" "${runs[@]}"
done
