#!/usr/bin/env bash
# PyTorch DDP on an emulated cluster (scripts/emulated-cluster.sh): the
# example of examples/ddp_fashion_mnist/ with each communication hook in
# turn, one process per host, gloo over the hosts' rate-limited NICs. Each
# process reads its own NIC's counters around every step (rank 0 logs them),
# so the bytes are the wire's. The table: scripts/ddp-table.py OUT. Needs
# root and the Python module (build/python); the cluster is brought up here
# and removed at the end.
#
#   scripts/ddp-cluster.sh OUT [options]
#     --hosts 4                 processes, one per emulated host
#     --rate 1gbit              each host's link, each direction
#     --model wide-mlp          or cnn
#     --steps 40                training steps per hook (then one evaluation)
#     --hooks "default torch-fp16 torch-powersgd exdyna topk skipreduce"
#                               DDP's own hooks (default, torch-fp16, torch-powersgd) or
#                               sparsecomm methods; runs go to OUT/<hook>. A method
#                               named METHOD@serial runs without overlap (its
#                               exchanges on backward's thread)
#     --density 0.01            the sparsecomm methods' density
#     --bucket-mb X             the sparsecomm methods' exchange groups (default: the
#                               whole model as one)
#     --ddp-bucket-mb 25        DDP's own buckets (bucket_cap_mb)
#     --timeout 300             seconds a hook's run may take before it is
#                               ended and counted as failed (a hook can hang
#                               in gloo: PowerSGD did here once)
#
# Resumable: a hook whose OUT/<hook>/summary.json exists is skipped. A hook
# that fails (PyTorch's PowerSGD aborts inside gloo here) leaves its log in
# OUT/<hook>.log and the next one runs.
set -euo pipefail

usage() { sed -n '2,31p' "$0" >&2; exit 2; }
(($# >= 1)) || usage
OUT=$1
shift
HOSTS=4
RATE=1gbit
MODEL=wide-mlp
STEPS=40
HOOKS="default torch-fp16 torch-powersgd exdyna topk skipreduce"
DENSITY=0.01
TIMEOUT=300
BUCKET_MB=
DDP_BUCKET_MB=25
while (($# > 0)); do
  case $1 in
    --hosts) HOSTS=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --model) MODEL=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --hooks) HOOKS=$2; shift 2 ;;
    --density) DENSITY=$2; shift 2 ;;
    --bucket-mb) BUCKET_MB=$2; shift 2 ;;
    --ddp-bucket-mb) DDP_BUCKET_MB=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    *) echo "ddp-cluster: unknown option '$1'" >&2; usage ;;
  esac
done
[[ $STEPS =~ ^[0-9]+$ ]] && ((STEPS >= 1)) || { echo "ddp-cluster: --steps must be >= 1, got '$STEPS'" >&2; exit 2; }
[[ $TIMEOUT =~ ^[0-9]+$ ]] && ((TIMEOUT >= 10)) || { echo "ddp-cluster: --timeout must be >= 10 seconds, got '$TIMEOUT'" >&2; exit 2; }

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CLUSTER=$ROOT/scripts/emulated-cluster.sh
EXAMPLE=$ROOT/examples/ddp_fashion_mnist/train.py
PYTHON=/usr/bin/python3  # Debian's, with python3-torch
[[ -d $ROOT/build/python/sparsecomm ]] ||
  { echo "ddp-cluster: build first (build/python/sparsecomm is missing; scripts/setup.sh builds it)" >&2; exit 1; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

"$CLUSTER" down >/dev/null 2>&1 || true
"$CLUSTER" up "$HOSTS" "$RATE" | tee "$OUT/cluster.txt"
trap '"$CLUSTER" down >/dev/null 2>&1 || true' EXIT

# mpirun starts the same command in every namespace; each process derives
# its host's interface (scv<rank>) from its rank, and gloo binds to it.
# The rendezvous is a file in the run's directory (the namespaces share the
# file system).
for hook in $HOOKS; do
  run=$OUT/$hook
  [[ -f $run/summary.json ]] && { echo "ddp-cluster: $hook done already"; continue; }
  rm -rf "$run"
  mkdir -p "$run"
  method=${hook%@serial}
  hook_args=(--ddp-bucket-mb "$DDP_BUCKET_MB")
  [[ $hook == *@serial ]] && hook_args+=(--no-overlap)
  [[ -n $BUCKET_MB ]] && hook_args+=(--bucket-mb "$BUCKET_MB")
  echo "ddp-cluster: $hook, $MODEL, $STEPS steps on $HOSTS hosts at $RATE ${hook_args[*]}"
  if ! timeout --kill-after 10 "$TIMEOUT" "$CLUSTER" run "$HOSTS" env PYTHONPATH="$ROOT/build/python" OMP_NUM_THREADS=1 \
      bash -c 'GLOO_SOCKET_IFNAME=scv$OMPI_COMM_WORLD_RANK exec "$@"' ddp-cluster \
      "$PYTHON" "$EXAMPLE" --model "$MODEL" --hook "$method" --density "$DENSITY" \
      --max-steps "$STEPS" --out "$run" ${hook_args[@]+"${hook_args[@]}"} > "$OUT/$hook.log" 2>&1; then
    echo "ddp-cluster: $hook failed or ran past ${TIMEOUT} s; the end of $OUT/$hook.log:" >&2
    tail -n 5 "$OUT/$hook.log" >&2
  fi
done
echo "ddp-cluster: done; table: scripts/ddp-table.py $OUT"
