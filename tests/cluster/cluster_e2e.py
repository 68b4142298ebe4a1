#!/usr/bin/python3
"""loom across emulated machines (tests/cluster/cluster.sh: network namespaces, each with
its own /dev/shm and host identity, joined by veth links to a bridge).

  cluster_e2e.py LOOM WORKDIR collectives   3 machines x 2 ranks: `loom bench --check` of
                                            every op and size (auto, and --algo hier), the
                                            ranks started by hand on each machine with the
                                            store on machine 0; the job sees 3 hosts, every
                                            result is right, shared memory only inside
                                            machines; a rank with another job token on
                                            machine 2 is refused and the job fails
  cluster_e2e.py LOOM WORKDIR train         `loom train` on 3 machines x 2 ranks with ZeRO-3,
                                            and tp 2 (inside each machine) x dp 3 (across):
                                            one process's losses within 1e-5
"""
import os
import secrets
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from common import (Trainer, compare, fail, losses, prepare_data)  # noqa: E402

LOOM, WORK, MODE = sys.argv[1], sys.argv[2], sys.argv[3]
CLUSTER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cluster.sh")
MACHINES, PER_MACHINE, PORT = 3, 2, 29611


def cluster(*args, **kw):
    return subprocess.run(["bash", CLUSTER, *args], check=True, **kw)


def start_job(argv, logs, bad_token_rank=-1, timeout_s=60):
    """Starts argv as MACHINES x PER_MACHINE ranks, each on its machine with the environment
    a launcher would give it (bad_token_rank gets another job token); returns the processes
    (rank order)."""
    token = secrets.token_hex(16)
    world = MACHINES * PER_MACHINE
    store = "LOOM_STORE=tcp://%s:%d" % (addr(0), PORT)  # rank 0 hosts it on machine 0
    procs = []
    for rank in range(world):
        m, local = divmod(rank, PER_MACHINE)
        env = ["LOOM_RANK=%d" % rank, "LOOM_WORLD_SIZE=%d" % world,
               "LOOM_LOCAL_RANK=%d" % local, "LOOM_LOCAL_WORLD_SIZE=%d" % PER_MACHINE,
               store,
               "LOOM_JOB_TOKEN=" + (secrets.token_hex(16) if rank == bad_token_rank else token),
               "LOOM_TIMEOUT_S=%d" % timeout_s]
        with open(os.path.join(logs, "rank%d.log" % rank), "w") as log:  # the child keeps it
            procs.append(subprocess.Popen(["bash", CLUSTER, "exec", str(m), "env", *env, *argv],
                                          stdout=log, stderr=subprocess.STDOUT))
    return procs


def wait_job(procs, logs, timeout=600):
    for rank, p in enumerate(procs):
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            fail("rank %d did not finish within %d s" % (rank, timeout))
        if rc != 0:
            fail("rank %d exited %d:\n%s" % (rank, rc, read(logs, rank)[-3000:]))


def read(logs, rank):
    with open(os.path.join(logs, "rank%d.log" % rank)) as f:
        return f.read()


def addr(m):
    return subprocess.run(["bash", CLUSTER, "addr", str(m)], capture_output=True, text=True,
                          check=True).stdout.strip()


def host_shm():
    return sorted(f for f in os.listdir("/dev/shm") if f.startswith("loom"))


def shm_mappings(pid):
    """The devices (maps' "major:minor") of the /dev/shm/loom* files process pid maps (loom
    unlinks a segment once both sides map it, so the mappings, not /dev/shm, show it)."""
    try:
        with open("/proc/%d/maps" % pid) as f:
            return {line.split()[3] for line in f if "/dev/shm/loom" in line}
    except OSError:
        return set()


def collectives():
    before = host_shm()
    seen_in_machine, seen_on_host = set(), set()
    for algo in ("auto", "hier"):
        logs = os.path.join(WORK, "bench_" + algo)
        os.makedirs(logs, exist_ok=True)
        procs = start_job([LOOM, "bench", "--op", "all", "--check", "--algo", algo, "--min", "8",
                           "--max", "1M", "--factor", "32", "--iters", "3", "--warmup", "1"],
                          logs)
        # While the job runs: its ranks map shared memory from their machine's /dev/shm
        # (another tmpfs than the host's), and nothing appears in the host's.
        while any(p.poll() is None for p in procs):
            seen_on_host.update(set(host_shm()) - set(before))
            seen_in_machine.update(shm_mappings(procs[0].pid))
            time.sleep(0.02)
        wait_job(procs, logs)
        out = read(logs, 0)
        if "6 ranks, 6 ranks on 3 host(s)" not in out:
            head = "\n".join(line for line in out.splitlines() if line.startswith("#"))
            fail("the job should see 3 hosts of 2 ranks:\n" + head)
        if "Out of bounds values : 0 OK" not in out:
            fail("wrong results (--algo %s):\n%s" % (algo, out[-3000:]))
        print("ok  3 machines x 2 ranks, --algo %s: every op and size right" % algo)
    if seen_on_host or host_shm() != before:
        fail("the machines' ranks made shared memory in the host's /dev/shm: %s" %
             sorted(seen_on_host))
    st = os.stat("/dev/shm").st_dev
    host_dev = "%02x:%02x" % (os.major(st), os.minor(st))
    if not seen_in_machine or host_dev in seen_in_machine:
        fail("rank 0 should map shared memory from its machine's /dev/shm (device other than "
             "the host's %s), seen: %s" % (host_dev, seen_in_machine))
    print("ok  rank 0 maps shared memory from its machine's own /dev/shm (device %s, the "
          "host's %s); none in the host's" % (",".join(sorted(seen_in_machine)), host_dev))
    unauthenticated()


def unauthenticated():
    """A rank on machine 2 with another token is refused by the store on machine 0 before
    any data flows (the store names its address), fails itself, and the job fails within
    its deadline naming the rank that never joined."""
    logs = os.path.join(WORK, "bad_token")
    os.makedirs(logs, exist_ok=True)
    bad = MACHINES * PER_MACHINE - 1
    t0 = time.time()
    procs = start_job([LOOM, "bench", "--op", "allreduce", "--min", "8", "--max", "8"], logs,
                      bad_token_rank=bad, timeout_s=5)
    for p in procs:
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            fail("the job with an unauthenticated rank hung")
    if any(p.returncode == 0 for p in procs):
        fail("ranks succeeded although rank %d had another token: %s" %
             (bad, [p.returncode for p in procs]))
    theirs, store = read(logs, bad), read(logs, 0)
    if "refused this connection" not in theirs:
        fail("the rank with another token should be told it was refused:\n" + theirs[-1500:])
    if "refused store connection from %s" % addr(MACHINES - 1) not in store:
        fail("the store (rank 0) should log the refusal naming machine %d's address:\n%s" %
             (MACHINES - 1, store[-1500:]))
    if "world/peer/%d" % bad not in read(logs, 1):
        fail("the other ranks should name the rank that never joined:\n" + read(logs, 1)[-1500:])
    print("ok  a rank on machine %d with another token: refused by the store, the job failed "
          "in %.1f s" % (MACHINES - 1, time.time() - t0))


def train():
    data = prepare_data(LOOM, WORK)
    T = Trainer(LOOM, data)
    batch = ["--set", "train.global_batch=12"]  # 6 data-parallel ranks x micro-batch 2
    base_dir = os.path.join(WORK, "one")
    T.train(base_dir, 1, *batch)
    base = losses(base_dir)
    for name, extra in (("ZeRO-3", batch + ["--set", "train.zero=3"]),
                        ("tp 2 x dp 3, ZeRO-1",
                         batch + ["--set", "train.tp=2", "--set", "train.zero=1"])):
        d = os.path.join(WORK, "cluster_" + name.replace(" ", "_").replace(",", ""))
        logs = d + "_logs"
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(logs, exist_ok=True)
        wait_job(start_job([LOOM] + T.args(d, *extra), logs), logs)
        compare("3 machines x 2 ranks, " + name, losses(d), base)


if __name__ == "__main__":
    os.makedirs(WORK, exist_ok=True)
    cluster("up", str(MACHINES))
    try:
        {"collectives": collectives, "train": train}[MODE]()
    finally:
        cluster("down")
