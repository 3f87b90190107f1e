#!/usr/bin/env bash
# Time to a target on emulated clusters (scripts/emulated-cluster.sh): for
# each rate and host count, calibrates the cluster (`sparsecomm calibrate`,
# kept as profile.json), then trains each cell of CELLS on it under mpirun
# with evaluation off the clock (--eval-deferred). scripts/time-to-target.py
# reads the runs, the seconds each took to the target and `plan`'s
# prediction beside them. Needs root.
#
#   scripts/time-to-target.sh OUT CELLS [options]
#     --rates "50mbit 100mbit"   link rates (each direction of each host)
#     --hosts "4"                host counts
#     --seed 42
#     --common "FLAGS"           train flags for every cell (model, epochs, ...)
#     --short "CELL@RATE ..."    cells trained for --short-steps steps only at that
#                                rate: their step time, for a time composed with the
#                                steps to the target of the same cell's run elsewhere
#     --short-steps 60
#     --queue-ms 50              each link's queue (docs/benchmarks/methodology.md, "Broadcast bursts")
#
# CELLS: lines `NAME FLAGS...` as for scripts/accuracy-table.py; `{network}`
# in FLAGS becomes the cluster's calibrated profile (for --density auto's
# --network-profile). Runs go to OUT/<rate>-h<hosts>/<NAME>; a run whose
# summary.json exists is skipped, so the script resumes. SPARSECOMM_BIN
# names another binary than build/sparsecomm.
set -euo pipefail

usage() { sed -n '2,24p' "$0" >&2; exit 2; }
(($# >= 2)) || usage
OUT=$1
CELLS=$2
shift 2
RATES="50mbit 100mbit"
HOSTS="4"
SEED=42
COMMON=""
SHORT=""
SHORT_STEPS=60
QUEUE_MS=50
while (($# > 0)); do
  (($# >= 2)) || { echo "time-to-target: $1 needs a value" >&2; usage; }
  case $1 in
    --rates) RATES=$2 ;;
    --hosts) HOSTS=$2 ;;
    --seed) SEED=$2 ;;
    --common) COMMON=$2 ;;
    --short) SHORT=$2 ;;
    --short-steps) SHORT_STEPS=$2 ;;
    --queue-ms) QUEUE_MS=$2 ;;
    *) echo "time-to-target: unknown option '$1'" >&2; usage ;;
  esac
  shift 2
done
for value in $HOSTS "$SEED" "$SHORT_STEPS" "$QUEUE_MS"; do
  [[ $value =~ ^[0-9]+$ ]] ||
    { echo "time-to-target: --hosts, --seed, --short-steps and --queue-ms take integers, got '$value'" >&2; exit 2; }
done
[[ -f $CELLS ]] || { echo "time-to-target: no cells file '$CELLS'" >&2; exit 2; }

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${SPARSECOMM_BIN:-$ROOT/build/sparsecomm}
CLUSTER=$ROOT/scripts/emulated-cluster.sh
[[ -x $BIN ]] || { echo "time-to-target: build first ($BIN is missing)" >&2; exit 1; }
mkdir -p "$OUT"
cp "$CELLS" "$OUT/cells.txt"
trap '"$CLUSTER" down' EXIT

# The cells: "NAME FLAGS..." lines without comments.
mapfile -t LINES < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$CELLS")
((${#LINES[@]} > 0)) || { echo "time-to-target: '$CELLS' has no cell" >&2; exit 2; }

for rate in $RATES; do
  for hosts in $HOSTS; do
    cluster_dir=$OUT/$rate-h$hosts
    mkdir -p "$cluster_dir"
    profile=$cluster_dir/profile.json
    SPARSECOMM_BIN=$BIN "$CLUSTER" calibrated "$hosts" "$rate" "$QUEUE_MS" "$profile"
    for line in "${LINES[@]}"; do
      read -r name flags <<< "$line"
      dir=$cluster_dir/$name
      [[ -f $dir/summary.json ]] && continue
      rm -rf "$dir"
      read -r -a cell_flags <<< "${flags//\{network\}/$profile}"
      read -r -a common_flags <<< "$COMMON"
      extra=()
      [[ " $SHORT " == *" $name@$rate "* ]] && extra=(--stop-at-step "$SHORT_STEPS")
      echo "time-to-target: $rate, $hosts hosts, $name ${extra[*]} ($(date +%T))"
      "$CLUSTER" run "$hosts" "$BIN" train --backend mpi -n "$hosts" "${common_flags[@]}" \
        "${cell_flags[@]}" --seed "$SEED" --eval-deferred --no-plots "${extra[@]}" \
        --out "$dir" > "$dir.log" 2>&1 || echo "time-to-target: $name failed (see $dir.log)"
    done
  done
done
