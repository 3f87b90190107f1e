#!/usr/bin/env bash
# Checks the performance model (sparsecomm plan) against runs on emulated
# clusters (scripts/emulated-cluster.sh): for each link rate and host count
# it calibrates a cost profile on that cluster, then trains each model with
# each method for a few steps and compares the measured exchange time, step
# time and wire bytes per rank with the prediction. Needs root.
#
#   scripts/validate-model.sh OUT [options]
#     --rates "200mbit 1gbit"   link rates (each direction of each host)
#     --hosts "2 4 8"           cluster sizes; HxR: H hosts of R ranks each,
#                               every method flat (cell <model>-<method>) and
#                               on two levels (--ranks-per-host R, cell
#                               <model>-<method>-hostR); the link inside a
#                               host calibrated on one host's R ranks
#                               (host-profile.json, plan --host-profile)
#     --models "wide-mlp cnn"
#     --methods "dense skipreduce topk dgc gaussiank randomk cltk micro exdyna deft ps"
#                               a method may carry its options after a colon,
#                               METHOD:KEY=VALUE[,KEY=VALUE] (powersgd:rank=4,
#                               exdyna:values=int2): train's -o, cell
#                               <model>-<method>-<key><value>...
#     --steps 6                 measured steps per cell (after 3 untimed ones)
#     --queue-ms 5              each emulated link's queue, in ms of traffic
#     --delay-us 0              also delay every message this long
#                               (SPARSECOMM_MESSAGE_DELAY_US: the latency terms)
#     --min-numel 0             train with --min-numel N (tensors with fewer
#                               elements averaged densely beside the method);
#                               cells <model>-<method>-min<N>; not for ps
#     --threads                 ranks as threads of one process instead (no
#                               cluster, no root; rates ignored, no wire bytes)
#
# Resumable: a cell (OUT/<rate>-h<hosts>[-q<ms>][-delay<us>]/<model>-<method>[-min<N>]) whose
# result.json exists is skipped, and so is a profile already calibrated
# (remove profile.json to calibrate that cluster again).
# Wire bytes are the hosts' NIC counters: a run of 3 steps and a run of
# 3 + N steps, the difference over N steps (so start-up traffic cancels).
# `ps` runs BSP with dense pushes on W workers and S servers (S = W = H/2;
# 1 and 1 on 2 hosts). The table: scripts/validate-model.py OUT.
set -euo pipefail

usage() { sed -n '2,33p' "$0" >&2; exit 2; }
(($# >= 1)) || usage
OUT=$1
shift
RATES="200mbit 1gbit"
HOSTS="2 4 8"
MODELS="wide-mlp cnn"
METHODS="dense skipreduce topk dgc gaussiank randomk cltk micro exdyna deft ps"
STEPS=6
DELAY_US=0
MIN_NUMEL=0
QUEUE_MS=5
THREADS=0
while (($# > 0)); do
  case $1 in
    --rates) RATES=$2; shift 2 ;;
    --hosts) HOSTS=$2; shift 2 ;;
    --models) MODELS=$2; shift 2 ;;
    --methods) METHODS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --delay-us) DELAY_US=$2; shift 2 ;;
    --min-numel) MIN_NUMEL=$2; shift 2 ;;
    --queue-ms) QUEUE_MS=$2; shift 2 ;;
    --threads) THREADS=1; RATES=threads; shift ;;
    *) echo "validate-model: unknown option '$1'" >&2; usage ;;
  esac
done
[[ $STEPS =~ ^[0-9]+$ ]] && ((STEPS >= 2)) || { echo "validate-model: --steps must be >= 2" >&2; exit 2; }
[[ $DELAY_US =~ ^[0-9]+$ ]] || { echo "validate-model: --delay-us must be a number" >&2; exit 2; }
[[ $QUEUE_MS =~ ^[0-9]+$ ]] || { echo "validate-model: --queue-ms must be a number" >&2; exit 2; }
[[ $MIN_NUMEL =~ ^[0-9]+$ ]] || { echo "validate-model: --min-numel must be a number" >&2; exit 2; }
CELL_SUFFIX=""  # cells trained with --min-numel are named apart
((MIN_NUMEL == 0)) || CELL_SUFFIX=-min$MIN_NUMEL
if ((MIN_NUMEL > 0)) && [[ " $METHODS " == *" ps "* ]]; then
  echo "validate-model: --min-numel is for all-reduce methods; drop ps from --methods" >&2
  exit 2
fi

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$ROOT/build/sparsecomm
CLUSTER=$ROOT/scripts/emulated-cluster.sh
[[ -x $BIN ]] || { echo "validate-model: build first ($BIN is missing)" >&2; exit 1; }
mkdir -p "$OUT"
export SPARSECOMM_MESSAGE_DELAY_US=$DELAY_US
((THREADS)) || trap '"$CLUSTER" down' EXIT

# Sum of tx bytes over the hosts (one number; 0 on threads: no wire).
wire_tx() {
  if ((THREADS)); then echo 0; return; fi
  "$CLUSTER" counters "$1" | awk '{s += $2} END {printf "%.0f\n", s}'
}

# The sparsecomm command on HOSTS ranks: a job across the cluster, or threads.
on_ranks() {
  local hosts=$1
  shift
  if ((THREADS)); then
    "$BIN" "$@" --backend thread
  else
    "$CLUSTER" run "$hosts" "$BIN" "$@" --backend mpi
  fi
}

# A method spec's cell name: powersgd:rank=4 -> powersgd-rank4.
cell_name() {
  local spec=$1
  [[ $spec == *:* ]] || { echo "$spec"; return; }
  local options=${spec#*:}
  options=${options//=/}
  echo "${spec%%:*}-${options//,/-}"
}

# train on the cluster: HOSTS[xR] MODEL METHOD[:OPTIONS] STEPS RUN_DIR [RANKS_PER_HOST]
train() {
  local cluster=$1 model=$2 spec=$3 steps=$4 dir=$5 levels=${6:-1}
  local hosts=${cluster%x*} per_host=1
  [[ $cluster == *x* ]] && per_host=${cluster#*x}
  local method=${spec%%:*}
  local -a args=(--model "$model" --max-steps "$steps" --batch 64
                 --eval-every 1000000 --eval-deferred --out "$dir")
  case $method in  # the methods without a density refuse -d
    dense | skipreduce | ps | powersgd | demo | qsgd | terngrad | signsgd | natural) ;;
    *) args+=(-d 0.01) ;;
  esac
  ((MIN_NUMEL == 0)) || args+=(--min-numel "$MIN_NUMEL")
  ((levels == 1)) || args+=(--ranks-per-host "$levels")
  if [[ $method == ps ]]; then
    local servers=$((hosts / 2))
    args+=(-m dense --servers "$servers" -n $((hosts - servers)))
  else
    args+=(-m "$method" -n $((hosts * per_host)))
    if [[ $spec == *:* ]]; then
      local option
      IFS=, read -ra options <<< "${spec#*:}"
      for option in "${options[@]}"; do args+=(-o "$option"); done
    fi
  fi
  on_ranks "$cluster" train "${args[@]}" > "$dir.log" 2>&1
}

for rate in $RATES; do
  for cluster in $HOSTS; do
    [[ $cluster =~ ^([0-9]+)(x([0-9]+))?$ ]] ||
      { echo "validate-model: --hosts takes H or HxR, got '$cluster'" >&2; exit 2; }
    hosts=${BASH_REMATCH[1]}
    per_host=${BASH_REMATCH[3]:-1}
    if ((per_host > 1)) && { ((THREADS)) || [[ " $METHODS " == *" ps "* ]]; }; then
      echo "validate-model: HxR needs the cluster and all-reduce methods (no --threads, no ps)" >&2
      exit 2
    fi
    # Each method flat, and on two levels where a host runs several ranks.
    levels_list=1
    ((per_host == 1)) || levels_list="1 $per_host"
    cell_dir=$OUT/$rate-h$cluster
    ((QUEUE_MS != 5 && !THREADS)) && cell_dir+=-q$QUEUE_MS
    ((DELAY_US > 0)) && cell_dir+=-delay$DELAY_US
    mkdir -p "$cell_dir"
    todo=0
    [[ -f $cell_dir/profile.json ]] || todo=1  # a removed profile is calibrated again
    ((per_host == 1)) || [[ -f $cell_dir/host-profile.json ]] || todo=1
    for model in $MODELS; do
      for method in $METHODS; do
        for levels in $levels_list; do
          suffix=$CELL_SUFFIX
          ((levels == 1)) || suffix+=-host$levels
          [[ -f $cell_dir/$model-$(cell_name "$method")$suffix/result.json ]] || todo=1
        done
      done
    done
    ((todo)) || continue
    profile=$cell_dir/profile.json
    if ((!THREADS)); then
      SPARSECOMM_BIN=$BIN "$CLUSTER" calibrated "$hosts" "$rate" "$QUEUE_MS" "$profile"
    elif [[ ! -f $profile ]]; then
      on_ranks "$hosts" calibrate -n "$hosts" --iters 8 --name "$rate, $hosts ranks" \
        --out "$profile" > "$cell_dir/calibrate.log" 2>&1
    fi
    if ((per_host > 1)) && [[ ! -f $cell_dir/host-profile.json ]]; then
      # The link inside a host: one host's ranks, over its own address.
      "$CLUSTER" run "1x$per_host" "$BIN" calibrate -n "$per_host" --iters 8 \
        --name "inside a host of $per_host ranks" --out "$cell_dir/host-profile.json" \
        --backend mpi > "$cell_dir/host-calibrate.log" 2>&1
    fi
    for model in $MODELS; do
      for method in $METHODS; do
       for levels in $levels_list; do
        suffix=$CELL_SUFFIX
        ((levels == 1)) || suffix+=-host$levels
        cell=$cell_dir/$model-$(cell_name "$method")$suffix
        [[ -f $cell/result.json ]] && continue
        rm -rf "$cell" && mkdir -p "$cell"
        echo "validate-model: $rate, $cluster hosts, $model, $method, $levels rank(s) per host"
        before=$(wire_tx "$hosts")
        train "$cluster" "$model" "$method" 3 "$cell/short" "$levels"
        middle=$(wire_tx "$hosts")
        train "$cluster" "$model" "$method" $((3 + STEPS)) "$cell/long" "$levels"
        after=$(wire_tx "$hosts")
        # The measurement; validate-model.py adds the prediction.
        SPARSECOMM_SCRIPTS="$ROOT/scripts" SPARSECOMM_BIN="$BIN" \
          /usr/bin/python3 - "$cell" "$hosts" "$method" "$STEPS" "$before" "$middle" "$after" \
          "$levels" <<'EOF'
import json, os, statistics, sys
sys.path.insert(0, os.environ["SPARSECOMM_SCRIPTS"])
import run_dirs
cell, hosts, spec, steps, before, middle, after, levels = sys.argv[1:]
method, _, options = spec.partition(":")
hosts, steps = int(hosts), int(steps)
wire = ((int(after) - int(middle)) - (int(middle) - int(before))) / steps / hosts
wire = wire if wire > 0 else None  # threads: no wire
run = run_dirs.load_run(f"{cell}/long")
rows = run["steps"]
walls = [r["wall_s"] for r in rows]
timed = [r for r in rows if r["step"] >= 3]
step_s = [walls[i] - walls[i - 1] for i in range(1, len(walls)) if rows[i]["step"] >= 3]
summary = run["summary"]
med = lambda key: statistics.median(r.get(key, 0.0) for r in timed)
def selected_mean(r):
    # Every rank's mean selection, from rank 0's view of the allgather: it
    # receives every block but its own, so the blocks sum to what it
    # received plus its own block (encoded indices and 4-byte values),
    # less the ring all-reduce of the tensors sent densely (--min-numel).
    n, own = summary["workers"], r.get("selected", 0)
    if method not in ("topk", "dgc", "gaussiank") or own <= 0 or n < 2:
        return own
    own_block = r.get("index_bytes_encoded", 4 * own) + 4 * own
    dense_ring = 2 * (n - 1) / n * 4 * r.get("dense_numel", 0)
    return own * (r.get("bytes_received", 0) - dense_ring + own_block) / n / own_block
def over_workers(phase):
    means = summary.get("per_worker_mean_s", {}).get(phase)
    return statistics.mean(means) if means else None
json.dump({"hosts": hosts, "method": method, "options": options,
           "ranks_per_host": int(levels),
           "model": summary["model"], "numel": summary["numel"],
           # Of numel, averaged densely beside the method (--min-numel).
           "dense_numel": timed[0].get("dense_numel", 0),
           "workers": summary["workers"], "servers": summary.get("servers", 0),
           "steps_timed": len(timed), "compute_s": med("compute_s"),
           # The arrival wait's input (plan --compute-spread-ms): rank 0's
           # spread over the steps, standing in for the spread across ranks.
           "compute_spread_s": statistics.stdev(r["compute_s"] for r in timed),
           # The spread across ranks within a step and the mean wait for the
           # slowest rank, from every rank's compute times (summary.json;
           # over all steps of the run, the 3 untimed ones included, before
           # steps_skipped below was recorded; over the timed ones since).
           "compute_spread_across_ranks_s": summary.get("compute_spread_s"),
           # Its root mean square over the steps instead of the mean (runs
           # since 2026-11-27, evening; before, compute_spread_s was this).
           "compute_spread_rms_s": summary.get("compute_spread_rms_s"),
           "arrival_wait_s": summary.get("arrival_wait_s"),
           # Every worker's mean over the steps after the first 3 (the timed
           # ones; summary.json's phase_times_skipped_steps): the model
           # predicts the mean over ranks, and rank 0 may wait less or more.
           # The spread and the wait above cover the same steps when this is set.
           "steps_skipped": summary.get("phase_times_skipped_steps"),
           "compute_over_workers_s": over_workers("compute"),
           "exchange_over_workers_s": over_workers("exchange"),
           "selection_s": med("selection_s"),
           # A parameter-server worker also waits for its grant (BSP): that
           # wait is part of its exchange, as in the model.
           "exchange_s": statistics.median(r.get("exchange_s", 0.0) + r.get("wait_s", 0.0)
                                           for r in timed),
           "update_s": med("update_s"), "step_s": statistics.median(step_s),
           # The step's first collective: its latency and the wait for the
           # slowest rank to arrive from its compute (sparse methods).
           "agreement_s": med("agreement_s"),
           "bytes_sent_code": med("bytes_sent"), "wire_bytes_per_host": wire,
           # The cell's own sparsification statistics (rank 0's view; means
           # over the timed steps): validate-model.py --measured-stats.
           "density_ratio": statistics.mean(r.get("density_ratio", 1.0) for r in timed),
           "selected": statistics.mean(selected_mean(r) for r in timed),
           "imbalance": statistics.mean(r.get("imbalance", 0.0) for r in timed),
           "selection_collectives": statistics.mean(r.get("selection_collectives", 0)
                                                    for r in timed)},
          open(f"{cell}/result.json", "w"), indent=1)
EOF
       done
      done
    done
  done
done
echo "validate-model: done; table: scripts/validate-model.py $OUT"
