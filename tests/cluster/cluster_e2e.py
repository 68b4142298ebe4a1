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
  cluster_e2e.py LOOM WORKDIR elastic       `loom run --rdzv etcd://...` on each machine (a
                                            real etcd on machine 0): 3 machines x 2 ranks
                                            meet and train; machine 2 is killed (every
                                            process on it) and the other two go on from the
                                            latest checkpoint; machine 2 starts again, waits,
                                            and is admitted at a checkpoint; then its link
                                            is cut, its lease expires and the other two go
                                            on; the losses are one process's throughout,
                                            within 1e-5
"""
import os
import re
import secrets
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from common import (Trainer, compare, fail, losses, metrics, prepare_data,  # noqa: E402
                    wait_for)

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


def start_etcd():
    """A real etcd (Debian etcd-server) on machine 0, serving the machines' network."""
    data = os.path.join(WORK, "etcd")
    shutil.rmtree(data, ignore_errors=True)
    url = "http://%s:2379" % addr(0)
    log = open(os.path.join(WORK, "etcd.log"), "w")
    p = subprocess.Popen(["bash", CLUSTER, "exec", "0", "etcd", "--data-dir", data,
                          "--listen-client-urls", url, "--advertise-client-urls", url,
                          "--listen-peer-urls", "http://127.0.0.1:2380",
                          "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
                          "--initial-cluster", "default=http://127.0.0.1:2380"],
                         stdout=log, stderr=subprocess.STDOUT)
    wait_for(lambda: subprocess.run(["bash", CLUSTER, "exec", "0", "etcdctl", "--endpoints",
                                     url, "endpoint", "health"],
                                    capture_output=True).returncode == 0,
             30, "etcd to answer on machine 0")
    return p, url


def elastic():
    """torchrun-style elastic training across the machines, membership through etcd."""
    data = prepare_data(LOOM, WORK)
    T = Trainer(LOOM, data)
    steps = 40
    # 24 sequences per step: 6 data-parallel ranks x micro-batch 2 x 2, or 4 x 2 x 3.
    extra = ["--set", "train.global_batch=24", "--set", "train.zero=1", "--set",
             "ckpt.every=5"]
    base_dir = os.path.join(WORK, "elastic_one")
    T.train(base_dir, 1, *extra, steps=steps)
    base = losses(base_dir)
    etcd, url = start_etcd()
    d = os.path.join(WORK, "elastic")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    env = dict(os.environ, LOOM_JOB_TOKEN=secrets.token_hex(16), LOOM_TIMEOUT_S="60")
    run = ["run", "--nnodes", "2:3", "--nproc-per-node", str(PER_MACHINE), "--rdzv",
           "etcd://%s:2379" % addr(0), "--rdzv-id", "elastic-e2e", "--rdzv-last-call", "3",
           "--max-restarts", "2", "--", LOOM] + T.args(d, *extra, steps=steps)
    procs, logs = {}, {}

    def launch(m, tag):
        logs[m] = os.path.join(d + "_m%d_%s.log" % (m, tag))
        with open(logs[m], "w") as log:
            procs[m] = subprocess.Popen(["bash", CLUSTER, "exec", str(m), LOOM, *run],
                                        stdout=log, stderr=subprocess.STDOUT, env=env)

    def step():
        try:
            return max([m["step"] for m in metrics(d) if "loss" in m] or [0])
        except OSError:
            return 0

    def log(m):
        with open(logs[m]) as f:
            return f.read()

    def wait(pred, timeout, what):  # failing at once if a machine's loom run ended
        def check():
            for m, p in procs.items():
                if p.poll() is not None and m not in gone:
                    fail("machine %d's loom run exited %d while waiting for %s:\n%s" %
                         (m, p.returncode, what, log(m)[-3000:]))
            return pred()
        wait_for(check, timeout, what)

    gone = set()

    try:
        for m in range(MACHINES):
            launch(m, "first")
        wait(lambda: step() >= 7, 300, "the 3 machines to train 7 steps")
        if "6 ranks" not in log(0) and "ranks 0-1 of 6" not in log(0):
            fail("the first round should have 3 machines x 2 ranks:\n" + log(0)[-2000:])
        # Machine 2 crashes: every process on it is killed, its launcher included.
        gone.add(MACHINES - 1)
        cluster("kill", str(MACHINES - 1))
        killed = time.time()
        procs[MACHINES - 1].wait()
        wait(lambda: "round 1: machine 0 of 2" in log(0), 120,
                 "machines 0 and 1 to meet again without machine 2")
        print("ok  machine 2 killed at step >= 7: the other two met again in round 1 after "
              "%.1f s" % (time.time() - killed))
        resumed_at = step()
        wait(lambda: step() >= resumed_at + 3, 300, "2 machines to train 3 steps")
        # Machine 2 comes back: it waits, and is admitted at the next checkpoint.
        launch(MACHINES - 1, "again")
        gone.clear()
        wait(lambda: "round 2: machine 0 of 3" in log(0), 180,
                 "machine 2 to be admitted (round 2)")
        print("ok  machine 2 started again: admitted in round 2 at a checkpoint")
        # Its link is cut: alive but unreachable. Only its lease's expiry tells the others.
        admitted_at = step()
        wait(lambda: step() >= admitted_at + 3, 300, "3 machines to train 3 steps again")
        gone.add(MACHINES - 1)
        cluster("cut", str(MACHINES - 1))
        cut = time.time()
        wait(lambda: "machine loomc-2 was lost" in log(0), 60,
             "machines 0 and 1 to notice machine 2's link cut")
        noticed = time.time() - cut
        if noticed > 15:
            fail("machine 2's cut link was noticed after %.1f s (15 s allowed)" % noticed)
        wait(lambda: "round 3: machine 0 of 2" in log(0), 60, "round 3 without machine 2")
        print("ok  machine 2's link cut: noticed in %.1f s (lease 10 s), round 3 met after "
              "%.1f s" % (noticed, time.time() - cut))
        procs.pop(MACHINES - 1).kill()  # it waits on peers it cannot reach; stop it
        for m, p in procs.items():
            try:
                rc = p.wait(timeout=600)
            except subprocess.TimeoutExpired:
                fail("machine %d's loom run did not finish:\n%s" % (m, log(m)[-3000:]))
            if rc != 0:
                fail("machine %d's loom run exited %d:\n%s" % (m, rc, log(m)[-3000:]))
    finally:
        for p in procs.values():
            p.kill()
        etcd.kill()
    rounds = sorted(set(int(r) for r in re.findall(r"elastic-e2e round (\d+)", log(0))))
    if rounds != [0, 1, 2, 3]:
        fail("machine 0 should have run rounds 0 to 3, ran %s:\n%s" % (rounds, log(0)[-3000:]))
    compare("elastic: 3 machines, 2, 3 again, then 2", losses(d), base)


if __name__ == "__main__":
    os.makedirs(WORK, exist_ok=True)
    cluster("up", str(MACHINES))
    try:
        {"collectives": collectives, "train": train, "elastic": elastic}[MODE]()
    finally:
        cluster("down")
