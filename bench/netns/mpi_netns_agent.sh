#!/usr/bin/env bash
# OpenMPI rsh launch agent for bench/netns/run.sh: mpirun calls it as
#   mpi_netns_agent.sh [ssh-style options] HOST COMMAND...
# where HOST is a namespace address from the hostfile; it runs COMMAND
# inside the network namespace that owns that address.
set -euo pipefail
while [[ $# -gt 0 && "$1" == -* ]]; do shift; done
host="$1"
shift
ns=$(grep -E "^${host//./\\.} " "${GRADCOMP_NETNS_MAP:?GRADCOMP_NETNS_MAP not set}" | awk '{print $2}')
if [[ -z "$ns" ]]; then
  echo "mpi_netns_agent: no namespace for host $host" >&2
  exit 1
fi
exec ip netns exec "$ns" /bin/sh -c "$*"
