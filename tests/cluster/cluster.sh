#!/usr/bin/env bash
# Emulated machines on this computer, for tests and benchmarks (docs/architecture.md,
# "several machines"): each machine is a network namespace with its own loopback, one
# Ethernet link (veth) to a switch (a bridge in a namespace of its own) and an address
# 10.77.0.(I+1)/24, plus its own /dev/shm and IPC namespace (namespaces share the host's
# /dev/shm and boot id by default, and loom would then use shared memory between
# "machines"). Programs run inside with LOOM_HOST_ID=loomc-I, loom's host identity.
# Nothing is routed out of the namespaces. Needs root (ip netns, mount).
#
#   cluster.sh up N [RATE]     N machines; RATE (e.g. 2gbit) shapes every link both ways
#                              with tbf (this kernel has no netem: no delay or loss here)
#   cluster.sh exec I CMD...   run CMD on machine I (its network, mounts, IPC)
#   cluster.sh addr I          machine I's address
#   cluster.sh kill I          SIGKILL everything running on machine I (a crash: the
#                              machine itself stays, and `exec` can start on it again)
#   cluster.sh cut I           cut machine I's link (both ends down): it is alive, unreachable
#   cluster.sh shape I RATE    shape machine I's link both ways from now on (RATE none: undo)
#   cluster.sh heal I          undo a cut and every iptables rule made inside machine I
#   cluster.sh down            stop everything started inside, remove it all (idempotent)
set -euo pipefail
STATE=/run/loom-cluster
PREFIX=loomc
SWITCH=${PREFIX}-sw

die() { echo "cluster.sh: $*" >&2; exit 1; }
addr() { echo "10.77.0.$(($1 + 1))"; }
holder() { cat "$STATE/$PREFIX-$1.pid" 2>/dev/null || die "machine $1 is not up (cluster.sh up N)"; }

check() {
  [ "$(id -u)" -eq 0 ] || die "needs root to create network namespaces and mount /dev/shm"
  command -v ip > /dev/null || die "needs iproute2 (ip netns)"
  ip netns add "$PREFIX-probe" 2> /dev/null || die "cannot create a network namespace here" \
    "(ip netns add failed: a container without CAP_SYS_ADMIN?)"
  ip netns del "$PREFIX-probe"
}

down() {
  if [ -d "$STATE" ]; then
    for f in "$STATE"/*.pid; do
      [ -e "$f" ] || continue
      pid=$(cat "$f")
      # Everything started in the machine shares its network namespace: kill by namespace.
      for p in $(ip netns pids "$(basename "$f" .pid)" 2> /dev/null); do kill -9 "$p" 2> /dev/null || true; done
      kill -9 "$pid" 2> /dev/null || true
    done
    rm -rf "$STATE"
  fi
  for ns in $(ip netns list 2> /dev/null | awk '{print $1}' | grep "^$PREFIX-" || true); do
    for p in $(ip netns pids "$ns" 2> /dev/null); do kill -9 "$p" 2> /dev/null || true; done
    ip netns del "$ns" 2> /dev/null || true
  done
}

shape() {  # shape NS DEV RATE: tbf on DEV's egress (burst >= rate / HZ, tc-tbf(8))
  ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "$3" burst 4mb latency 50ms
}

up() {
  local n=$1 rate=${2:-}
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "up N: N from 1 to 200"
  check
  down
  mkdir -p "$STATE"
  ip netns add "$SWITCH"
  ip -n "$SWITCH" link add br0 type bridge
  ip -n "$SWITCH" link set br0 up
  for ((i = 0; i < n; i++)); do
    local ns=$PREFIX-$i
    ip netns add "$ns"
    ip -n "$SWITCH" link add "p$i" type veth peer name eth0 netns "$ns"
    ip -n "$SWITCH" link set "p$i" master br0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$(addr "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    if [ -n "$rate" ]; then shape "$ns" eth0 "$rate" && shape "$SWITCH" "p$i" "$rate"; fi
    # The machine's own /dev/shm and IPC: a holder process in new mount and IPC namespaces
    # (inside the network namespace) that later commands enter with nsenter.
    ip netns exec "$ns" unshare --mount --ipc --propagation private \
      sh -c "mount -t tmpfs -o mode=1777,size=50% tmpfs /dev/shm && echo \$\$ > $STATE/$ns.pid && exec sleep infinity" < /dev/null > /dev/null 2>&1 &
    for _ in $(seq 100); do [ -s "$STATE/$ns.pid" ] && break; sleep 0.05; done
    [ -s "$STATE/$ns.pid" ] || die "machine $i: its /dev/shm holder did not start"
  done
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) down ;;
  addr) addr "$2" ;;
  cut)
    holder "$2" > /dev/null
    ip -n "$PREFIX-$2" link set eth0 down
    ip -n "$SWITCH" link set "p$2" down
    ;;
  shape)  # shape I RATE: machine I's link shaped both ways now; RATE "none": unshaped
    holder "$2" > /dev/null
    if [ "$3" = none ]; then
      ip netns exec "$PREFIX-$2" tc qdisc del dev eth0 root 2> /dev/null || true
      ip netns exec "$SWITCH" tc qdisc del dev "p$2" root 2> /dev/null || true
    else
      shape "$PREFIX-$2" eth0 "$3" && shape "$SWITCH" "p$2" "$3"
    fi
    ;;
  heal)
    holder "$2" > /dev/null
    ip -n "$PREFIX-$2" link set eth0 up
    ip -n "$SWITCH" link set "p$2" up
    ip netns exec "$PREFIX-$2" iptables -F
    ;;
  kill)
    pid=$(holder "$2")
    for p in $(ip netns pids "$PREFIX-$2"); do [ "$p" = "$pid" ] || kill -9 "$p" 2> /dev/null || true; done
    ;;
  exec)
    i=$2; shift 2
    pid=$(holder "$i")
    exec nsenter -t "$pid" --net --mount --ipc --wd="$PWD" env LOOM_HOST_ID="$PREFIX-$i" "$@"
    ;;
  *) die "usage: cluster.sh up N [RATE] | exec I CMD... | addr I | kill I | cut I | heal I | shape I RATE | down" ;;
esac
