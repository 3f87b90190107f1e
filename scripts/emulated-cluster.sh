#!/usr/bin/env bash
# An emulated cluster on one machine, for benchmarks where communication must
# cost wall time rather than CPU: each "host" is a network namespace with its
# own NIC, rate-limited in each direction (tc tbf on both ends of its veth:
# full duplex, like a real link), all joined by one bridge. Needs root.
#
#   scripts/emulated-cluster.sh up [HOSTS] [RATE] [QUEUE_MS]
#                                                   create sc0..sc<HOSTS-1>
#                                                   (default 4 hosts, 1gbit;
#                                                   each link's queue holds
#                                                   QUEUE_MS of traffic, 5)
#   scripts/emulated-cluster.sh run HOSTS[xR] CMD...
#                                                   mpirun CMD, one rank per host
#                                                   (R ranks with HOSTSxR: ranks
#                                                   h*R..h*R+R-1 on host h), over
#                                                   TCP only: a host's ranks talk
#                                                   through its own address, off
#                                                   the rate-limited link; each
#                                                   rank's SPARSECOMM_HOST_NAME
#                                                   is its host's (sc<h>)
#   scripts/emulated-cluster.sh counters HOSTS      "host tx_bytes rx_bytes" of
#                                                   each host's NIC (the wire)
#   scripts/emulated-cluster.sh calibrated HOSTS RATE QUEUE_MS PROFILE
#                                                   a fresh cluster (down, then up),
#                                                   and PROFILE from `sparsecomm
#                                                   calibrate` on it unless PROFILE
#                                                   exists (log: calibrate.log beside
#                                                   it; the binary: SPARSECOMM_BIN,
#                                                   default build/sparsecomm)
#   scripts/emulated-cluster.sh down                remove every host and the bridge
#
# Example:
#   scripts/emulated-cluster.sh up 4 1gbit
#   scripts/emulated-cluster.sh run 4 build/sparsecomm bench pipeline --backend mpi
#   scripts/emulated-cluster.sh down
#
# Traffic only ever goes to the private 10.77.0.0/24 addresses made here.
set -euo pipefail

BRIDGE=scbr0
SUBNET=10.77.0
usage() { sed -n '2,35p' "$0" >&2; exit 2; }

need_root() {
  [[ $(id -u) -eq 0 ]] || { echo "emulated-cluster: needs root (network namespaces, tc)" >&2; exit 1; }
}

hosts_arg() {
  local hosts=${1:-4}
  [[ $hosts =~ ^[0-9]+$ ]] && ((hosts >= 1 && hosts <= 64)) ||
    { echo "emulated-cluster: HOSTS must be 1..64, got '$hosts'" >&2; exit 2; }
  echo "$hosts"
}

# Bytes of 1 ms at a tc rate such as 200mbit or 1gbit, at least 16384.
burst_bytes() {
  local rate=${1,,} number unit scale
  [[ $rate =~ ^([0-9]+)(kbit|mbit|gbit)$ ]] || return 1
  number=${BASH_REMATCH[1]}
  unit=${BASH_REMATCH[2]}
  case $unit in kbit) scale=1000 ;; mbit) scale=1000000 ;; gbit) scale=1000000000 ;; esac
  local bytes=$((number * scale / 8 / 1000))
  echo $((bytes > 16384 ? bytes : 16384))
}

# The tbf options that pace a burst, at rates up to 200 Mbit/s: a second
# bucket of four full frames, refilled 5% above the rate, so that a step's
# small exchange after an idle spell leaves at the link rate, as from a NIC,
# instead of draining the 1 ms bucket at memory speed. Empty above: on the
# 2-core machine at hand the per-frame timers of a paced link held 500 Mbit/s
# to 0.27-0.37 Gbit/s and 1 Gbit/s to 0.77, and bent the all-reduce off its
# line (docs/benchmarks/methodology.md, "Pacing the bucket").
pacing_options() {
  local rate=${1,,}
  [[ $rate =~ ^([0-9]+)(kbit|mbit|gbit)$ ]] || return 1
  local number=${BASH_REMATCH[1]} unit=${BASH_REMATCH[2]} kbit
  case $unit in kbit) kbit=$number ;; mbit) kbit=$((number * 1000)) ;; gbit) kbit=$((number * 1000000)) ;; esac
  ((kbit <= 200000)) && echo "peakrate $((kbit + kbit / 20))kbit minburst 6000"
  return 0
}

up() {
  need_root
  local hosts rate queue
  hosts=$(hosts_arg "${1:-4}")
  rate=${2:-1gbit}
  # The token bucket's queue, in ms of traffic at the link rate: 5 ms is a
  # shallow switch buffer (125 KB at 200 Mbit/s), where TCP can lose the
  # tail of a ~1 MiB burst and stall for its 200 ms retransmission timeout
  # (docs/benchmarks/methodology.md, "Broadcast"); 50 ms is a deep one.
  queue=${3:-5}
  [[ $queue =~ ^[0-9]+$ ]] && ((queue >= 1 && queue <= 1000)) ||
    { echo "emulated-cluster: QUEUE_MS must be 1..1000, got '$queue'" >&2; exit 2; }
  # The token bucket lets `burst` bytes leave at memory speed after an idle
  # spell, which a real NIC never does: keep it to 1 ms of traffic (at least
  # 16 KB), the least that still reaches the rate here (a 64 KB bucket held
  # a 1 Gbit/s link to 0.78 Gbit/s; 256 KB let a 200 Mbit/s host send a
  # step's 25 KB sparse exchange in no wire time at all).
  local burst
  burst=$(burst_bytes "$rate") ||
    { echo "emulated-cluster: RATE must be a number and kbit, mbit or gbit (e.g. 200mbit, 1gbit), got '$rate'" >&2; exit 2; }
  local -a pacing
  read -r -a pacing <<<"$(pacing_options "$rate")"
  if ip link show "$BRIDGE" >/dev/null 2>&1; then
    echo "emulated-cluster: $BRIDGE exists already; run '$0 down' first" >&2
    exit 1
  fi
  ip link add "$BRIDGE" type bridge
  ip addr add "$SUBNET.254/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  for ((i = 0; i < hosts; ++i)); do
    ip netns add "sc$i"
    ip link add "sch$i" type veth peer name "scv$i"
    ip link set "scv$i" netns "sc$i"
    ip link set "sch$i" master "$BRIDGE"
    ip link set "sch$i" up
    ip -n "sc$i" addr add "$SUBNET.$((i + 1))/24" dev "scv$i"
    ip -n "sc$i" link set "scv$i" up
    ip -n "sc$i" link set lo up
    # Upload: the namespace's end; download: the bridge's end of the veth.
    if ! ip netns exec "sc$i" tc qdisc add dev "scv$i" root tbf rate "$rate" burst "$burst" "${pacing[@]}" latency "${queue}ms" ||
       ! tc qdisc add dev "sch$i" root tbf rate "$rate" burst "$burst" "${pacing[@]}" latency "${queue}ms"; then
      echo "emulated-cluster: tc rejected rate '$rate' (examples: 100mbit, 1gbit)" >&2
      down
      exit 1
    fi
  done
  echo "emulated-cluster: $hosts hosts at $rate each (queue $queue ms, bursts ${pacing[*]:-not paced}) on $BRIDGE ($SUBNET.1..$SUBNET.$hosts)"
}

run() {
  need_root
  local hosts per_host=1
  if [[ ${1:-} =~ ^([0-9]+)x([0-9]+)$ ]]; then
    hosts=$(hosts_arg "${BASH_REMATCH[1]}")
    per_host=${BASH_REMATCH[2]}
    ((per_host >= 1 && per_host <= 64)) ||
      { echo "emulated-cluster: R in HOSTSxR must be 1..64, got '$per_host'" >&2; exit 2; }
  else
    hosts=$(hosts_arg "${1:-}")
  fi
  shift
  (($# > 0)) || usage
  for ((i = 0; i < hosts; ++i)); do
    ip netns list | grep -qw "sc$i" ||
      { echo "emulated-cluster: host sc$i does not exist; run '$0 up $hosts' first" >&2; exit 1; }
  done
  local -a app=()
  for ((i = 0; i < hosts; ++i)); do
    ((i > 0)) && app+=(:)
    # Each host's ranks carry its name: --ranks-per-host auto finds the hosts.
    app+=(-np "$per_host" -x "SPARSECOMM_HOST_NAME=sc$i" ip netns exec "sc$i" "$@")
  done
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_MCA_rmaps_base_oversubscribe=1
  export PMIX_MCA_ptl_tcp_if_include=$BRIDGE  # the namespaces must reach mpirun's PMIx server
  # Messages up to 2 MiB go eagerly (OpenMPI's TCP default is 64 KiB). With
  # the default, each of the ring's 1 MiB segments waits for a rendezvous
  # reply, and between two hosts that reply queues behind the bulk data
  # flowing the other way on the same TCP connection: a 16 MiB all-reduce
  # on 2 hosts ran at 0.49 of a 1 Gbit/s link, 0.96 with this setting
  # (docs/benchmarks/methodology.md, "Two hosts"). No shared-memory
  # transport: it would carry traffic between hosts around their links.
  exec mpirun --mca btl tcp,self --mca btl_tcp_if_include "$SUBNET.0/24" \
    --mca btl_tcp_eager_limit 2097152 --mca btl_tcp_max_send_size 2097152 "${app[@]}"
}

counters() {
  need_root
  local hosts
  hosts=$(hosts_arg "${1:-}")
  for ((i = 0; i < hosts; ++i)); do
    ip netns list | grep -qw "sc$i" ||
      { echo "emulated-cluster: host sc$i does not exist; run '$0 up $hosts' first" >&2; exit 1; }
    echo "$i $(ip netns exec "sc$i" cat "/sys/class/net/scv$i/statistics/tx_bytes")" \
      "$(ip netns exec "sc$i" cat "/sys/class/net/scv$i/statistics/rx_bytes")"
  done
}

# The drivers' loop over clusters (time-to-target.sh, validate-model.sh)
# starts each cluster with this.
calibrated() {
  need_root
  (($# == 4)) || usage
  local hosts=$1 rate=$2 queue=$3 profile=$4
  local bin=${SPARSECOMM_BIN:-$(cd "$(dirname "$0")/.." && pwd)/build/sparsecomm}
  [[ -x $bin ]] || { echo "emulated-cluster: build first ($bin is missing)" >&2; exit 1; }
  down
  up "$hosts" "$rate" "$queue"
  [[ -f $profile ]] && return 0
  echo "emulated-cluster: calibrating $hosts hosts at $rate ($(date +%T))"
  if ! (run "$hosts" "$bin" calibrate -n "$hosts" --iters 8 --backend mpi \
          --name "$rate, $hosts hosts" --out "$profile") > "$(dirname "$profile")/calibrate.log" 2>&1; then
    echo "emulated-cluster: calibrating failed (see $(dirname "$profile")/calibrate.log)" >&2
    exit 1
  fi
}

down() {
  need_root
  local ns
  for ns in $(ip netns list | awk '{print $1}' | grep -E '^sc[0-9]+$' || true); do
    ip netns del "$ns"
  done
  ip link del "$BRIDGE" 2>/dev/null || true
}

case ${1:-} in
  up) shift; up "$@" ;;
  run) shift; run "$@" ;;
  counters) shift; counters "$@" ;;
  calibrated) shift; calibrated "$@" ;;
  down) shift; down ;;
  *) usage ;;
esac
