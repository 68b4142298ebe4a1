#!/usr/bin/env bash
# OpenMPI's remote shell for the emulated machines (mpirun --mca plm_rsh_agent THIS):
# `mpi_agent.sh HOST CMD...` runs CMD through a shell on the machine whose address is HOST
# (10.77.0.I+1, tests/cluster/cluster.sh), as ssh would on a real cluster.
set -euo pipefail
host=$1
shift
[[ "$host" =~ ^10\.77\.0\.([0-9]+)$ ]] || { echo "mpi_agent.sh: $host is not a machine's address (10.77.0.N)" >&2; exit 1; }
exec bash "$(dirname "$0")/cluster.sh" exec "$((BASH_REMATCH[1] - 1))" sh -c "$*"
