#!/usr/bin/env bash
# A real Slurm cluster (Debian's slurmctld, slurmd, slurm-client 22.05 and munge) on the
# emulated machines of tests/cluster/cluster.sh, for tests: slurmctld on machine 0, one
# slurmd on each of the first N machines (node0..nodeN-1 at 10.77.0.1..N, each in its own
# UTS namespace with its node name as host name, and an /etc/hosts naming every node), one
# munged whose socket every machine reaches (a socket path is not hidden by network
# namespaces). No cgroups: proctrack/pgid, task/none. Needs root and `cluster.sh up M`
# with M >= N first. Facts this stands on: ../shared/CLUSTER-NOTES.md, "Slurm".
#
#   slurm.sh up N          start it; returns when sinfo shows N idle nodes
#   slurm.sh run I CMD...  run CMD (srun, sbatch, squeue, scontrol ...) on machine I with
#                          this cluster's configuration (SLURM_CONF) and without the
#                          emulation's LOOM_HOST_ID (the tasks' host identity is their
#                          node's host name, as on a real cluster)
#   slurm.sh down          stop every daemon and job, remove the state (idempotent)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CLUSTER=$HERE/cluster.sh
DIR=/run/loom-slurm
export SLURM_CONF=$DIR/slurm.conf

die() { echo "slurm.sh: $*" >&2; exit 1; }

down() {
  for f in "$DIR"/*.pid "$DIR"/munge/munged.pid; do
    [ -e "$f" ] || continue
    kill -9 "$(cat "$f")" 2> /dev/null || true
  done
  pkill -9 -f "slurmd -D -f $DIR/slurm.conf" 2> /dev/null || true
  pkill -9 -f "slurmctld -D -f $DIR/slurm.conf" 2> /dev/null || true
  pkill -9 -f "munged .*$DIR/munge" 2> /dev/null || true
  # The machines' /etc/hosts back to the host's (their mount namespaces outlive this).
  for f in /run/loom-cluster/loomc-*.pid; do
    [ -e "$f" ] || continue
    i=${f##*/loomc-}
    i=${i%.pid}
    while bash "$CLUSTER" exec "$i" umount /etc/hosts 2> /dev/null; do :; done
  done
  rm -rf "$DIR"
}

up() {
  local n=$1 i
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] || die "up N: N >= 1"
  for c in slurmctld slurmd srun munged mungekey; do
    command -v "$c" > /dev/null || die "needs $c (apt-get install slurmctld slurmd slurm-client munge; scripts/setup.sh does)"
  done
  down
  mkdir -p "$DIR/munge" "$DIR/state" "$DIR/log"
  for ((i = 0; i < n; i++)); do mkdir -p "$DIR/spool-node$i"; done
  # munge: a key made for this cluster, the daemon as the munge user, its socket's folder
  # 0711 (munged refuses a folder others cannot pass through).
  chown munge: "$DIR/munge"
  chmod 0711 "$DIR/munge"
  runuser -u munge -- mungekey -c -k "$DIR/munge/munge.key" > /dev/null
  runuser -u munge -- munged -S "$DIR/munge/munge.sock" --key-file "$DIR/munge/munge.key" \
    --log-file "$DIR/munge/munged.log" --pid-file "$DIR/munge/munged.pid" \
    --seed-file "$DIR/munge/munged.seed"
  local hosts="127.0.0.1 localhost"$'\n' nodes=""
  for ((i = 0; i < n; i++)); do
    hosts+="$(bash "$CLUSTER" addr "$i") node$i"$'\n'
    nodes+="NodeName=node$i NodeAddr=$(bash "$CLUSTER" addr "$i") CPUs=2 State=UNKNOWN"$'\n'
  done
  printf '%s' "$hosts" > "$DIR/hosts"
  cat > "$SLURM_CONF" << EOF
ClusterName=loom
SlurmctldHost=node0($(bash "$CLUSTER" addr 0))
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.sock
CredType=cred/munge
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SwitchType=switch/none
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
MailProg=/bin/true
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool-%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
KillWait=10
SlurmdTimeout=10
$nodes
PartitionName=loom Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  # slurmd loads a cgroup plugin even when nothing uses it; its autodetection fails on
  # this kernel's mix of v1 hierarchies and a v2 one under /sys/fs/cgroup/unified.
  echo "CgroupPlugin=cgroup/v1" > "$DIR/cgroup.conf"
  # Each machine's /etc/hosts names the nodes (a bind mount inside the machine's private
  # mount namespace; the host's file is untouched).
  for ((i = 0; i < n; i++)); do
    bash "$CLUSTER" exec "$i" mount --bind "$DIR/hosts" /etc/hosts
  done
  # slurmctld runs where SlurmctldHost says, by host name: node0's UTS namespace.
  bash "$CLUSTER" exec 0 env -u LOOM_HOST_ID unshare --uts \
    sh -c "hostname node0 && exec slurmctld -D -f $SLURM_CONF" \
    < /dev/null > "$DIR/log/slurmctld.out" 2>&1 &
  for ((i = 0; i < n; i++)); do
    bash "$CLUSTER" exec "$i" env -u LOOM_HOST_ID unshare --uts \
      sh -c "hostname node$i && exec slurmd -D -f $SLURM_CONF -N node$i" \
      < /dev/null > "$DIR/log/slurmd-node$i.out" 2>&1 &
  done
  for _ in $(seq 120); do
    idle=$(bash "$CLUSTER" exec 0 env SLURM_CONF="$SLURM_CONF" sinfo -h -N -t idle -o %N 2> /dev/null | wc -l)
    [ "$idle" -ge "$n" ] && return 0
    sleep 0.5
  done
  die "$n idle nodes did not appear within 60 s; see $DIR/log (sinfo: $(bash "$CLUSTER" exec 0 env SLURM_CONF="$SLURM_CONF" sinfo -N 2>&1 | tr '\n' ' '))"
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) down ;;
  run)
    i=$2; shift 2
    exec bash "$CLUSTER" exec "$i" env -u LOOM_HOST_ID SLURM_CONF="$SLURM_CONF" "$@"
    ;;
  *) die "usage: slurm.sh up N | run I CMD... | down" ;;
esac
