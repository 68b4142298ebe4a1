#!/usr/bin/env bash
# OpenMPI's remote shell agent for the emulated machines (tests/cluster/cluster.sh):
# `netns_rsh.sh [OPTIONS] HOST CMD...` runs CMD on the machine whose address is HOST
# (10.77.0.I+1), as ssh would on a cluster. Options ssh-style agents get are ignored.
while [[ "${1:-}" == -* ]]; do shift; done
host=$1
shift
exec bash "$(dirname "$(readlink -f "$0")")/../../tests/cluster/cluster.sh" exec "$((${host##*.} - 1))" sh -c "$*"
