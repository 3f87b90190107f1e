#!/usr/bin/env bash
# The click model (dlrm) on an emulated cluster (scripts/emulated-cluster.sh):
# each embedding exchange for a few hundred steps, and the dense all-reduce
# of the whole tables (the baseline) for a few, one rank per host over MPI,
# with the hosts' NIC counters read before and after each run. The table:
# scripts/click-table.py OUT. Needs root; the cluster is brought up here and
# removed at the end.
#
#   scripts/click-cluster.sh OUT [options]
#     --hosts 4              ranks, one per emulated host
#     --rate 1gbit           each host's link, each direction
#     --steps 300            steps of each row-sparse exchange
#     --dense-steps 4        steps of the dense all-reduce (1 GB per rank per step)
#     --batch 256            rows per rank per step
#     --method exdyna        the MLPs' synchronization
#     --exchanges "allgather sparse-allreduce dense"   (or sharded, auto)
#     --values fp32          the rows on the wire (bf16, fp16: half the bytes;
#                            not for dense); runs go to OUT/<exchange>[-<values>]
#
# Resumable: a run whose OUT/<run>/summary.json exists is skipped.
set -euo pipefail

usage() { sed -n '2,20p' "$0" >&2; exit 2; }
(($# >= 1)) || usage
OUT=$1
shift
HOSTS=4
RATE=1gbit
STEPS=300
DENSE_STEPS=4
BATCH=256
METHOD=exdyna
EXCHANGES="allgather sparse-allreduce dense"
VALUES=fp32
while (($# > 0)); do
  case $1 in
    --hosts) HOSTS=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --dense-steps) DENSE_STEPS=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --method) METHOD=$2; shift 2 ;;
    --exchanges) EXCHANGES=$2; shift 2 ;;
    --values) VALUES=$2; shift 2 ;;
    *) echo "click-cluster: unknown option '$1'" >&2; usage ;;
  esac
done
for n in "$STEPS" "$DENSE_STEPS" "$BATCH"; do
  [[ $n =~ ^[0-9]+$ ]] && ((n >= 1)) || { echo "click-cluster: step counts and --batch must be >= 1" >&2; exit 2; }
done

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$ROOT/build/sparsecomm
CLUSTER=$ROOT/scripts/emulated-cluster.sh
[[ -x $BIN ]] || { echo "click-cluster: build first ($BIN is missing)" >&2; exit 1; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

"$CLUSTER" down >/dev/null 2>&1 || true
"$CLUSTER" up "$HOSTS" "$RATE" | tee "$OUT/cluster.txt"
trap '"$CLUSTER" down >/dev/null 2>&1 || true' EXIT

for exchange in $EXCHANGES; do
  name=$exchange
  [[ $VALUES != fp32 ]] && name=$exchange-$VALUES
  run=$OUT/$name
  [[ -f $run/summary.json ]] && { echo "click-cluster: $name done already"; continue; }
  rm -rf "$run"
  steps=$STEPS
  [[ $exchange == dense ]] && steps=$DENSE_STEPS
  echo "click-cluster: $name, $steps steps on $HOSTS hosts at $RATE"
  "$CLUSTER" counters "$HOSTS" > "$OUT/$name.counters-before"
  "$CLUSTER" run "$HOSTS" "$BIN" train --backend mpi --model dlrm --method "$METHOD" \
    --embedding-exchange "$exchange" --embedding-values "$VALUES" --batch "$BATCH" --max-steps "$steps" \
    --eval-every 1000000 --test-samples 20000 --no-plots --timeout 600 --out "$run" \
    > "$OUT/$name.log" 2>&1
  "$CLUSTER" counters "$HOSTS" > "$OUT/$name.counters-after"
done
echo "click-cluster: done; table: scripts/click-table.py $OUT"
