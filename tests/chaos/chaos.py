#!/usr/bin/env python3
"""The fault campaign: seeded, randomised runs of training (every parallel layout) and of a
collective loop, each with one injected fault, checked from outside.

    chaos.py LOOM COMM_WORKER WORKDIR [--profile quick|long] [--seed S] [--faults N]
             [--table FILE]

Faults (one per run, at a random time, on a random rank):
  kill9        kill -9 of a rank; half the runs under `loom run --max-restarts 1`, which
               must recover; the others must end, and a resume must continue
  sigstop      SIGSTOP of a rank (a hang, not a crash): the job must end by its deadline
  tcp_cut      one TCP connection between two ranks destroyed from outside (`ss -K`, the
               kernel's SOCK_DESTROY: the socket fails with ECONNABORTED, its peer sees a
               reset), ranks over TCP (LOOM_TRANSPORT=tcp)
  store_kill   kill -9 of the `loom run` launcher, which hosts the rendezvous store: every
               rank must be gone within 3 s
  disk_full    the run folder on a tmpfs too small for a second checkpoint
  corrupt_ckpt a byte flipped in the newest checkpoint, then --resume
  corrupt_shard a byte flipped in a token shard, then training

For each run: the job ends (or recovers) within the bound; the root cause is named (the
rank and the operation, or the file); no /dev/shm/loom.* segment, no process and no
temporary file of the run is left; the last complete checkpoint loads and a resumed run
has the per-step losses of an uninterrupted one. The outcome table (fault x outcome) is
printed and, with --table, written as Markdown. Exit 1 if any run failed a check.
"""
import argparse
import collections
import glob
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from common import (TOL, Trainer, alive, losses, prepare_data, rank_pid,  # noqa: E402
                    worst_relative)

STEPS = 30        # per training run; checkpoints every 5
TIMEOUT_S = 8     # LOOM_TIMEOUT_S: a stopped rank's peers give up after this
WATCHDOG_S = 3    # LOOM_WATCHDOG_S: the hang report comes first

# (name, ranks, settings) of every parallel layout loom has.
LAYOUTS = [
    ("dp2 zero0", 2, ["train.zero=0"]),
    ("dp2 zero1", 2, ["train.zero=1"]),
    ("dp4 zero2", 4, ["train.zero=2"]),
    ("dp2 zero3", 2, ["train.zero=3"]),
    ("tp2", 2, ["train.tp=2"]),
    ("tp2 x dp2 zero1", 4, ["train.tp=2", "train.zero=1"]),
    ("pp2 1f1b", 2, ["train.pp=2"]),
    ("pp2 x dp2 zero1", 4, ["train.pp=2", "train.zero=1"]),
]
KINDS = ["kill9", "sigstop", "tcp_cut", "store_kill", "disk_full", "corrupt_ckpt",
         "corrupt_shard"]


class Trial:
    def __init__(self, index, kind, workload, rng):
        self.index, self.kind, self.workload = index, kind, workload
        self.rng = rng
        self.problems = []
        self.ended_s = None  # fault -> job end
        self.note = ""
        self.hung = False  # the harness had to kill it, or ranks outlived their launcher
        self.outcome = ""  # "recovered" (by a restart), "unaffected", or "" (ended as due)
        self.resume = ""  # "checked", "no checkpoint yet" (fault before step 5), or "" (n/a)

    def check(self, ok, what):
        if not ok:
            self.problems.append(what)
        return ok


def shm_names():
    return set(glob.glob("/dev/shm/loom.*"))


def leaked_shm(before):
    """Segments named since `before` whose creator ("/loom.<pid>.<random>") is gone: a live
    process's names come and go as its peers map them (another job may be running)."""
    out = []
    for name in shm_names() - before:
        pid = name.split(".")[1]
        if pid.isdigit() and not os.path.exists("/proc/" + pid):
            out.append(name)
    return sorted(out)


def rank_connections(pid):
    """(local port, peer port) of pid's established loopback TCP connections, except those to
    the rendezvous store (LOOM_STORE in its environment)."""
    with open("/proc/%d/environ" % pid, "rb") as f:
        env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    store = int(env.get(b"LOOM_STORE", b":0").rsplit(b":", 1)[1])
    out = subprocess.run(["ss", "-tnpH", "state", "established"], capture_output=True,
                         text=True).stdout
    conns = []
    for line in out.splitlines():
        if "pid=%d," % pid not in line:
            continue
        fields = line.split()
        local, peer = int(fields[2].rsplit(":", 1)[1]), int(fields[3].rsplit(":", 1)[1])
        if store not in (local, peer):
            conns.append((local, peer))
    return conns


def processes_mentioning(text):
    pids = []
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == os.getpid():
            continue
        try:
            with open("/proc/%s/cmdline" % p, "rb") as f:
                if text.encode() in f.read():
                    pids.append(int(p))
        except OSError:
            pass
    return pids


class Campaign:
    def __init__(self, args):
        self.loom, self.worker, self.work = args.loom, args.comm_worker, args.workdir
        os.makedirs(self.work, exist_ok=True)
        self.data = prepare_data(self.loom, self.work)
        self.T = Trainer(self.loom, self.data)
        self.refs = {}

    # ---- running jobs ----
    def settings(self, layout):
        out = []
        for s in layout[2]:
            out += ["--set", s]
        return out + ["--set", "ckpt.every=5", "--set", "train.system_sample_s=0"]

    def env(self):
        return dict(os.environ, LOOM_TIMEOUT_S=str(TIMEOUT_S), LOOM_WATCHDOG_S=str(WATCHDOG_S))

    def start(self, cmd, log):
        f = open(log, "w")
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=self.env(),
                                start_new_session=True), f

    def finish(self, proc, f, log, bound, t):
        """Waits up to bound seconds; returns (rc or None if it had to be killed: then the
        trial counts as hung, text)."""
        try:
            rc = proc.wait(timeout=bound)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
            t.hung = True
        f.close()
        with open(log) as g:
            return rc, g.read()

    def train_cmd(self, layout, run_dir, *extra, restarts=0):
        n = layout[1]
        cmd = [self.loom, "run", "-n", str(n)]
        if restarts:
            cmd += ["--max-restarts", str(restarts)]
        return cmd + [self.loom] + self.T.args(run_dir, *self.settings(layout), *extra,
                                               steps=STEPS)

    def reference(self, layout):
        """Losses of the uninterrupted run of a layout (run once per campaign)."""
        if layout[0] not in self.refs:
            d = os.path.join(self.work, "ref_" + re.sub(r"\W+", "_", layout[0]))
            shutil.rmtree(d, ignore_errors=True)
            subprocess.run(self.train_cmd(layout, d), check=True, capture_output=True,
                           env=self.env())
            self.refs[layout[0]] = losses(d)
        return self.refs[layout[0]]

    def resume_matches(self, t, layout, run_dir):
        """--resume from run_dir's newest complete checkpoint (copied to a normal folder):
        the losses after it must be the uninterrupted run's."""
        ckpts = sorted(glob.glob(os.path.join(run_dir, "ckpt", "step_*")))
        if not ckpts:  # the fault came before the first checkpoint (step 5): counted apart
            t.note += "no checkpoint yet; "
            t.resume = "no checkpoint yet"
            return
        step = int(ckpts[-1].rsplit("_", 1)[1])
        d = run_dir + "_resumed"
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(run_dir, d, ignore=shutil.ignore_patterns("*.tmp"))
        p = subprocess.run(self.train_cmd(layout, d, "--resume"), capture_output=True, text=True,
                           env=self.env(), timeout=300)
        if not t.check(p.returncode == 0, "the resume failed: " + p.stderr[-500:]):
            return
        want = self.reference(layout)
        got = losses(d)
        later = [s for s in want if s > step]
        if not later:  # the newest checkpoint is the last step's: it loaded, nothing to run
            t.note += "resumed at the last step; "
            return
        worst = worst_relative(got, want, later)
        t.resume = "checked"
        t.check(worst <= TOL, "resumed from step %d, the losses differ by %.1e" % (step, worst))
        t.note += "resumed from step %d, losses within %.0e; " % (step, worst)
        shutil.rmtree(d, ignore_errors=True)

    # ---- the faults ----
    def wait_progress(self, run_dir, step, proc, bound=120):
        """Until metrics.jsonl has `step` (the fault lands mid-training)."""
        end = time.time() + bound
        path = os.path.join(run_dir, "metrics.jsonl")
        while time.time() < end and proc.poll() is None:
            try:
                with open(path) as f:
                    if any(re.search(r'"step": ?%d\b' % step, line) for line in f):
                        return True
            except OSError:
                pass
            time.sleep(0.02)
        return False

    def run_trial(self, t):
        before = shm_names()
        run_dir = os.path.join(self.work, "t%03d" % t.index)
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.rmtree(run_dir + "_resumed", ignore_errors=True)
        getattr(self, "fault_" + t.kind)(t, run_dir)
        # What every fault must leave behind: nothing of the run's.
        time.sleep(0.3)
        left = processes_mentioning(run_dir)
        t.check(not left, "processes of the run were left: %s" % left)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        leaked = leaked_shm(before)
        t.check(not leaked, "shared-memory segments left: %s" % leaked)
        temps = [os.path.join(r, n) for r, ds, fs in os.walk(run_dir) for n in ds + fs
                 if n.endswith(".tmp") and t.kind not in ("kill9", "store_kill", "sigstop",
                                                          "disk_full")]
        t.check(not temps, "temporary files left: %s" % temps)
        if os.path.ismount(run_dir):
            subprocess.run(["umount", run_dir], check=False)
        shutil.rmtree(run_dir, ignore_errors=True)

    def collective_loop(self, t):
        return t.workload == "collectives"

    def signal_mid_training(self, t, layout, run_dir, sig, bound, restarts=False):
        """Trains layout into run_dir and sends sig to a random rank after a random step;
        returns (exit code, output, the rank, its pid) once the job ends (or bound s)."""
        proc, f = self.start(self.train_cmd(layout, run_dir, restarts=1 if restarts else 0),
                             run_dir + ".log")
        at = t.rng.randint(2, STEPS - 3)
        victim = t.rng.randrange(layout[1])
        self.wait_progress(run_dir, at, proc)
        pid = rank_pid(proc.pid, victim)
        t0 = time.time()
        if pid:
            os.kill(pid, sig)
        rc, text = self.finish(proc, f, run_dir + ".log", bound, t)
        t.ended_s = time.time() - t0
        t.note += "rank %d %s after step %d; " % (victim, signal.Signals(sig).name, at)
        return rc, text, victim, pid

    def fault_kill9(self, t, run_dir):
        if self.collective_loop(t):
            return self.signal_loop(t, run_dir, signal.SIGKILL)
        layout = t.workload
        restarts = t.rng.random() < 0.5
        rc, text, victim, pid = self.signal_mid_training(
            t, layout, run_dir, signal.SIGKILL, 300 if restarts else 30, restarts=restarts)
        if not t.check(pid is not None, "rank %d was not found" % victim):
            return
        if restarts:
            t.check(rc == 0, "with --max-restarts 1 the job should recover, exit %s: %s" %
                    (rc, text[-400:]))
            worst = worst_relative(losses(run_dir), self.reference(layout))
            t.check(worst <= TOL, "after the restart the losses differ by %.1e" % worst)
            t.note += "recovered by restart, losses within %.0e" % worst
            t.outcome = "recovered"
        else:
            t.check(rc not in (0, None) and t.ended_s < 15,
                    "the job should end within 15 s, exit %s after %.1f s" % (rc, t.ended_s))
            t.check(re.search(r"rank %d \(pid %d\) was killed by signal 9" % (victim, pid), text),
                    "the launcher should name the killed rank: " + text[-400:])
            self.resume_matches(t, layout, run_dir)

    def fault_sigstop(self, t, run_dir):
        if self.collective_loop(t):
            return self.signal_loop(t, run_dir, signal.SIGSTOP)
        layout = t.workload
        rc, text, victim, _ = self.signal_mid_training(t, layout, run_dir, signal.SIGSTOP,
                                                        TIMEOUT_S + 30)
        self.expect_hang_named(t, rc, text, victim)
        self.resume_matches(t, layout, run_dir)

    def expect_hang_named(self, t, rc, text, victim):
        t.check(rc not in (0, None) and t.ended_s < TIMEOUT_S + 12,
                "the job should end by its deadline (%d s), exit %s after %.1f s" %
                (TIMEOUT_S, rc, t.ended_s))
        named = (re.search(r"behind: rank %d\b" % victim, text) or
                 re.search(r"timed out in \w+\(.*waiting for rank\(s\) [0-9, ]*\b%d\b" % victim,
                           text))
        t.check(named, "the stopped rank %d should be named: %s" % (victim, text[-600:]))
        t.check(re.search(r"(allreduce|allgather|reduce_scatter|broadcast|send|recv|barrier)"
                          r"\(", text), "the operation should be named")

    def signal_loop(self, t, run_dir, sig):
        """The collective loop (comm_worker soak) on 4 ranks, signalled at a random time."""
        os.makedirs(run_dir, exist_ok=True)
        cmd = [self.loom, "run", "-n", "4", self.worker, "soak", "1000000", run_dir]
        proc, f = self.start(cmd, run_dir + ".log")
        time.sleep(t.rng.uniform(1.0, 6.0))
        victim = t.rng.randrange(4)
        pid = rank_pid(proc.pid, victim)
        t0 = time.time()
        if pid:
            os.kill(pid, sig)
        rc, text = self.finish(proc, f, run_dir + ".log", TIMEOUT_S + 30, t)
        t.ended_s = time.time() - t0
        t.note += "collective loop, rank %d %s; " % (victim, signal.Signals(sig).name)
        if sig == signal.SIGKILL:
            t.check(rc not in (0, None) and t.ended_s < 15,
                    "the job should end within 15 s, exit %s after %.1f s" % (rc, t.ended_s))
            t.check(re.search(r"rank %d \(pid %d\) was killed by signal 9" % (victim, pid), text),
                    "the launcher should name the killed rank")
        else:
            self.expect_hang_named(t, rc, text, victim)

    def fault_tcp_cut(self, t, run_dir):
        tcp = ["LOOM_TRANSPORT=tcp"]
        if self.collective_loop(t):
            os.makedirs(run_dir, exist_ok=True)
            cmd = ["env"] + tcp + [self.loom, "run", "-n", "4", self.worker, "soak", "1000000",
                                   run_dir]
            proc, f = self.start(cmd, run_dir + ".log")
            time.sleep(t.rng.uniform(2.0, 6.0))
            layout, n = None, 4
        else:
            layout = t.workload
            n = layout[1]
            proc, f = self.start(["env"] + tcp + self.train_cmd(layout, run_dir), run_dir + ".log")
            self.wait_progress(run_dir, t.rng.randint(2, STEPS - 3), proc)
        victim = t.rng.randrange(n)
        pid = rank_pid(proc.pid, victim)  # (env execs the launcher: the same process)
        conns = rank_connections(pid) if pid else []
        t0 = time.time()
        cut = False
        if conns:
            local, peer = t.rng.choice(conns)
            ss = subprocess.run(["ss", "-K", "src", "127.0.0.1:%d" % local,
                                 "dst", "127.0.0.1:%d" % peer], capture_output=True, text=True)
            # The cut must have happened before the trial counts: ss -K lists what it
            # destroyed (nothing where the kernel lacks CONFIG_INET_DIAG_DESTROY), and the
            # connection leaves the rank's established ones (or the rank is gone).
            listed = ":%d" % local in ss.stdout
            end = time.time() + 2
            while time.time() < end and alive(pid) and (local, peer) in rank_connections(pid):
                time.sleep(0.05)
            cut = listed and (not alive(pid) or (local, peer) not in rank_connections(pid))
        rc, text = self.finish(proc, f, run_dir + ".log", 30, t)
        t.ended_s = time.time() - t0
        if not t.check(conns, "rank %s had no connection to another rank" % victim):
            return
        if not t.check(cut, "ss -K did not destroy rank %d's connection %d->%d (it listed: %r)" %
                       (victim, local, peer, ss.stdout.strip()[-200:])):
            return
        t.note += "rank %d's connection %d->%d destroyed; " % (victim, local, peer)
        if rc == 0 and layout:
            # The connection was idle until the end (a communicator the layout no longer
            # uses): the job must then have trained exactly as without the fault.
            worst = worst_relative(losses(run_dir), self.reference(layout))
            t.check(worst <= TOL, "unaffected by the cut, yet the losses differ by %.1e" % worst)
            t.note += "an idle connection: the job finished with the uninterrupted losses"
            t.outcome = "unaffected"
            return
        t.check(rc not in (0, None) and t.ended_s < 15,
                "the job should end within 15 s, exit %s after %.1f s" % (rc, t.ended_s))
        t.check(re.search(r"(TCP connection to rank \d+|rank \d+ .*(closed|reset|abort))", text)
                and re.search(r"(allreduce|allgather|reduce_scatter|broadcast|send|recv|barrier|"
                              r"alltoall|reduce)\(", text),
                "a rank should name the peer and the operation: " + text[-600:])
        if layout:
            self.resume_matches(t, layout, run_dir)

    def fault_store_kill(self, t, run_dir):
        if self.collective_loop(t):
            os.makedirs(run_dir, exist_ok=True)
            cmd = [self.loom, "run", "-n", "4", self.worker, "soak", "1000000", run_dir]
            proc, f = self.start(cmd, run_dir + ".log")
            time.sleep(t.rng.uniform(1.0, 6.0))
            layout, n = None, 4
        else:
            layout = t.workload
            n = layout[1]
            proc, f = self.start(self.train_cmd(layout, run_dir), run_dir + ".log")
            if not t.check(self.wait_progress(run_dir, t.rng.randint(2, STEPS // 2), proc),
                           "the job ended before the fault (exit %s)" % proc.poll()):
                proc.kill(), proc.wait(), f.close()
                return
        ranks = [p for p in (rank_pid(proc.pid, r) for r in range(n)) if p]
        if not t.check(len(ranks) == n, "found %d of the %d ranks' processes" % (len(ranks), n)):
            proc.kill(), proc.wait(), f.close()
            return
        t0 = time.time()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        f.close()
        end = time.time() + 15
        while time.time() < end and any(alive(p) for p in ranks):
            time.sleep(0.05)
        t.ended_s = time.time() - t0
        t.note += "launcher (store host) killed; "
        # Ranks die with their launcher (PR_SET_PDEATHSIG): at once, not when they next
        # print or finish the job.
        t.hung = t.ended_s >= 3
        t.check(not t.hung, "ranks outlived their launcher by %.1f s" % t.ended_s)
        if layout:
            self.resume_matches(t, layout, run_dir)

    def fault_disk_full(self, t, run_dir):
        layout = t.workload
        os.makedirs(run_dir)
        # Room for one checkpoint of tiny (~39 MB) and the logs, not a second beside it.
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=60m", "tmpfs", run_dir]).returncode:
            t.check(False, "cannot mount a tmpfs (root is needed)")
            return
        proc, f = self.start(self.train_cmd(layout, run_dir), run_dir + ".log")
        t0 = time.time()
        rc, text = self.finish(proc, f, run_dir + ".log", 120, t)
        t.ended_s = time.time() - t0
        t.check(rc == 2, "a full disk should end the job with a user error (2), got %s" % rc)
        t.check(re.search(r"No space left on device", text) and "ckpt" in text,
                "the error should name the checkpoint and the full disk: " + text[-400:])
        # The first checkpoint is intact; copy the run off the tmpfs and resume from it.
        safe = run_dir + "_safe"
        shutil.rmtree(safe, ignore_errors=True)
        shutil.copytree(run_dir, safe, ignore=shutil.ignore_patterns("*.tmp"))
        subprocess.run(["umount", run_dir], check=False)
        t.note += "tmpfs of 60 MB; "
        self.resume_matches(t, layout, safe)
        shutil.rmtree(safe, ignore_errors=True)

    def fault_corrupt_ckpt(self, t, run_dir):
        layout = t.workload
        p = subprocess.run(self.train_cmd(layout, run_dir), capture_output=True, env=self.env())
        if not t.check(p.returncode == 0, "the uninterrupted run failed"):
            return
        newest = sorted(glob.glob(os.path.join(run_dir, "ckpt", "step_*")))[-1]
        files = sorted(glob.glob(os.path.join(newest, "data-*.bin")))
        victim = t.rng.choice(files)
        with open(victim, "r+b") as g:
            size = os.path.getsize(victim)
            at = t.rng.randrange(size)
            g.seek(at)
            b = g.read(1)
            g.seek(at)
            g.write(bytes([b[0] ^ (1 << t.rng.randrange(8))]))
        t.note += "bit flipped at byte %d of %s; " % (at, os.path.relpath(victim, run_dir))
        proc, f = self.start(self.train_cmd(layout, run_dir, "--resume"), run_dir + ".log")
        t0 = time.time()
        rc, text = self.finish(proc, f, run_dir + ".log", 60, t)
        t.ended_s = time.time() - t0
        # Every rank reads every tensor it needs: a rank whose pieces avoid the flipped byte
        # may load fine; the job must fail with the file named.
        t.check(rc == 2, "a corrupt checkpoint should end the job with a user error, got %s" % rc)
        t.check(os.path.basename(victim) + " fails its checksum" in text,
                "the error should name the file: " + text[-400:])
        # The older checkpoints are untouched: drop the damaged one, resume.
        shutil.rmtree(newest)
        self.resume_matches(t, layout, run_dir)

    def fault_corrupt_shard(self, t, run_dir):
        layout = t.workload
        data = run_dir + "_data"
        shutil.rmtree(data, ignore_errors=True)
        shutil.copytree(self.data, data)
        shard = os.path.join(data, "train_000000.bin")
        with open(shard, "r+b") as g:
            at = t.rng.randrange(64, os.path.getsize(shard))
            g.seek(at)
            b = g.read(1)
            g.seek(at)
            g.write(bytes([b[0] ^ 0x40]))
        cmd = self.train_cmd(layout, run_dir, "--set", "data.path=" + data)
        proc, f = self.start(cmd, run_dir + ".log")
        t0 = time.time()
        rc, text = self.finish(proc, f, run_dir + ".log", 60, t)
        t.ended_s = time.time() - t0
        t.note += "byte %d of the train shard; " % at
        t.check(rc == 2, "a corrupt shard should end the job with a user error, got %s" % rc)
        t.check("train_000000.bin" in text and "checksum" in text,
                "the error should name the shard: " + text[-400:])
        shutil.rmtree(data, ignore_errors=True)


def campaign_args(*positional):
    """The command line both campaigns take (this one and machines.py): the positional
    arguments, then --profile, --seed, --faults and --table."""
    ap = argparse.ArgumentParser()
    for name in positional:
        ap.add_argument(name)
    ap.add_argument("--profile", choices=["quick", "long"], default="quick")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--faults", type=int, default=0)
    ap.add_argument("--table", default="")
    return ap.parse_args()


def main():
    args = campaign_args("loom", "comm_worker", "workdir")
    n = args.faults or (len(KINDS) if args.profile == "quick" else 102)
    rng = random.Random(args.seed)
    c = Campaign(args)
    results = []
    t_start = time.time()
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        loops_ok = kind in ("kill9", "sigstop", "store_kill")
        workload = ("collectives" if loops_ok and rng.random() < 0.25 else rng.choice(LAYOUTS))
        t = Trial(i, kind, workload, random.Random(rng.getrandbits(64)))
        t0 = time.time()
        try:
            c.run_trial(t)
        except Exception as e:  # a harness failure is a failed run, not a crash
            t.problems.append("harness: %r at %s" % (e, traceback.format_exc().splitlines()[-3]))
        name = workload if isinstance(workload, str) else workload[0]
        status = "ok" if not t.problems else "FAIL"
        print("%3d %-13s %-18s %-4s ended in %s (%.0f s) %s%s" % (
            i, kind, name, status, "%.1f s" % t.ended_s if t.ended_s is not None else "-",
            time.time() - t0, t.note, "".join("\n      - " + p for p in t.problems)),
            flush=True)
        results.append((t, name))

    table = collections.OrderedDict((k, []) for k in KINDS)
    for t, name in results:
        table[t.kind].append(t)
    lines = ["| fault | runs | ended as due | recovered by restart | unaffected | hung | "
             "failed another check | resume checked / fault before the first checkpoint | "
             "time to end (median / max) | workloads |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for k, ts in table.items():
        if not ts:
            continue
        ends = [t.ended_s for t in ts if t.ended_s is not None]
        hung = sum(1 for t in ts if t.hung)
        failed = sum(1 for t in ts if t.problems)
        good = [t for t in ts if not t.problems]
        names = sorted(set(name for t, name in results if t.kind == k))
        lines.append("| %s | %d | %d | %d | %d | %d | %d | %d / %d | %s | %s |" % (
            k, len(ts), sum(1 for t in good if not t.outcome),
            sum(1 for t in good if t.outcome == "recovered"),
            sum(1 for t in good if t.outcome == "unaffected"), hung, failed - hung,
            sum(1 for t in ts if t.resume == "checked"),
            sum(1 for t in ts if t.resume == "no checkpoint yet"),
            "%.1f s / %.1f s" % (statistics.median(ends), max(ends)) if ends else "-",
            ", ".join(names)))
    bad = [t for t, _ in results if t.problems]
    summary = ("%d faults, seed %d, %.0f s: %d passed every check, %d did not" %
               (n, args.seed, time.time() - t_start, n - len(bad), len(bad)))
    print("\n" + "\n".join(lines) + "\n\n" + summary)
    if args.table:
        with open(args.table, "w") as f:
            f.write("\n".join(lines) + "\n\n" + summary + "\n")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
