#!/usr/bin/env bash
# A real bandwidth-limited network on one machine: N network namespaces (one
# per MPI rank) joined by veth pairs on a bridge, each rank's link limited
# with `tc qdisc ... tbf rate <RATE>` in both directions, and the MPI job
# launched one rank per namespace over TCP.
#
#   bench/netns/run.sh [--ranks N] [--rate 1gbit] [--keep] -- PROGRAM [ARGS...]
#
# Needs root (ip netns, tc). Everything it creates is named gcnb* and is
# removed on exit, on failure and on Ctrl-C. Addresses are 10.203.0.0/24,
# private to the namespaces this script makes.
set -euo pipefail

ranks=4
rate=1gbit
keep=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --ranks) ranks="$2"; shift 2 ;;
    --rate) rate="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
if [[ $# -eq 0 ]]; then
  echo "run.sh: no program given (… -- PROGRAM ARGS)" >&2
  exit 2
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "run.sh: needs root for ip netns and tc" >&2
  exit 2
fi
if ! [[ "$ranks" =~ ^[0-9]+$ ]] || (( ranks < 2 || ranks > 32 )); then
  echo "run.sh: --ranks must be 2..32" >&2
  exit 2
fi

here=$(cd "$(dirname "$0")" && pwd)
bridge=gcnbbr0
work=""

remove_network() {
  set +e
  for ((i = 0; i < 32; ++i)); do
    ip netns pids "gcnb$i" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "gcnb$i" 2>/dev/null
    ip link del "gcnbp$i" 2>/dev/null
  done
  ip link del "$bridge" 2>/dev/null
  return 0
}
cleanup() {
  set +e
  remove_network
  [[ -n "$work" ]] && rm -rf "$work"
}
if [[ $keep -eq 0 ]]; then trap cleanup EXIT INT TERM; fi
remove_network  # leftovers of an interrupted earlier run
work=$(mktemp -d /tmp/gradcomp-netns.XXXXXX)

ip link add "$bridge" type bridge
ip addr add 10.203.0.254/24 dev "$bridge"
ip link set "$bridge" up
: > "$work/hosts"
: > "$work/map"
for ((i = 0; i < ranks; ++i)); do
  ns="gcnb$i"
  addr="10.203.0.$((i + 1))"
  ip netns add "$ns"
  ip link add "gcnbv$i" type veth peer name "gcnbp$i"
  ip link set "gcnbv$i" netns "$ns"
  ip link set "gcnbp$i" master "$bridge"
  ip link set "gcnbp$i" up
  ip -n "$ns" addr add "$addr/24" dev "gcnbv$i"
  ip -n "$ns" link set "gcnbv$i" up
  ip -n "$ns" link set lo up
  # Egress of the rank (its uplink) and egress of its bridge port (its downlink).
  ip netns exec "$ns" tc qdisc add dev "gcnbv$i" root tbf rate "$rate" burst 1mbit latency 100ms
  tc qdisc add dev "gcnbp$i" root tbf rate "$rate" burst 1mbit latency 100ms
  echo "$addr slots=1" >> "$work/hosts"
  echo "$addr $ns" >> "$work/map"
done

echo "netns: $ranks ranks, each link limited to $rate (tbf), bridge $bridge" >&2
export GRADCOMP_NETNS_MAP="$work/map"
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
mpirun --hostfile "$work/hosts" -np "$ranks" \
  --mca plm_rsh_agent "$here/mpi_netns_agent.sh" \
  --mca btl tcp,self --mca btl_tcp_if_include 10.203.0.0/24 --mca oob_tcp_if_include 10.203.0.0/24 \
  -x GRADCOMP_NETNS_RATE="$rate" \
  "$@"
