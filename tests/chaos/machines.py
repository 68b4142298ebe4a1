#!/usr/bin/python3
"""The fault campaign across machines: faults that only exist between machines, injected at
random times into training jobs on emulated machines (tests/cluster/cluster.sh), checked from
outside.

    machines.py LOOM WORKDIR [--profile quick|long] [--seed S] [--faults N] [--table FILE]

A job is `loom run --rdzv etcd://A,B,C` of `tiny` on each of 3 machines x 2 ranks (ZeRO-1,
--nnodes 2:3), against a 3-member etcd cluster on a 4th machine (so a machine's crash does
not take an etcd member with it). Faults come one at a time, in a seeded random order; each
is waited out and the machine restored before the next:

  crash        every process of a machine killed at once; its `loom run` is started again,
               as an operator (or Slurm's requeue) would
  link_down    the machine's link down at both ends (`ip link set down`): alive, unreachable
  drop_both    iptables drops everything on the machine's link, both directions
  drop_one     iptables drops one direction only (in or out, drawn)
  etcd_cut     the machine cut from etcd (iptables on the etcd machine's address) but not from
               its peers
  second       a crash, then while the survivors regroup, every rank of a second machine
               killed (a fault during the recovery from the first)
  slow         the machine's link shaped to 10 Mbit/s both ways mid-step, for a step: the
               job slows down and goes on, no restart
  etcd_member  one etcd member (the leader or a follower, drawn) killed, started again
               after 5 steps: the job goes on, no restart

Checked for each fault: a surviving machine stops its ranks within the kind's detection
bound; the text every surviving machine wrote between the fault and its next round names
the lost machine or one of its ranks; training resumes (a new step in a round of the
survivors) within 60 s; then the machine is restored (started again, or its link healed:
its own `loom run` must rejoin by itself) and admitted at a checkpoint. For the two kinds
that must not cost a restart: no new round, and training went on. For each job: every
machine's `loom run` ends 0, the losses are one process's within 1e-5, every checkpoint
left is complete and matches its checksums, and nothing is left behind (no process of the
job, no /dev/shm/loom.* segment on any machine; after the campaign no namespace). The
outcome table (kind x outcome, time to detect and to resume) is printed and, with --table,
written as Markdown. Exit 1 if any fault failed a check.
"""
import collections
import glob
import json
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
import cluster_e2e as ce  # noqa: E402
from chaos import campaign_args, processes_mentioning  # noqa: E402
from common import (TOL, Trainer, checksum64, children, losses, prepare_data,  # noqa: E402
                    until, worst_relative)

KINDS = ["crash", "link_down", "drop_both", "drop_one", "etcd_cut", "second", "slow",
         "etcd_member"]
ETCD_MACHINE = 3
DETECT_S = {"crash": 5, "second": 5}  # the rest: cut off, seen by the lease (10 s) or the
DETECT_DEFAULT_S = 20                 # heartbeat (10 s), plus a keep-alive attempt
RESUME_S = 60
# Steps the survivors train per fault while the harness waits (for a detection, a rejoin:
# mostly bounded by the next checkpoint, but a machine back from an etcd cut registers
# only after its own retry, and the others train on meanwhile: up to 52 steps seen at
# ~0.2 s a step; the quick profile's 8th fault came at step 111 of 222). A faster host trains
# more steps in the same waits: room for that (~1.8x); every step past the last fault is
# waited for (~0.2 s each).
STEPS_PER_FAULT = 24
EXTRA = ce.ELASTIC_ARGS + ["--set", "optim.lr=1e-3"]  # see cluster_e2e.faults()
STOPPED = re.compile(r"stopping this machine's ranks|this machine's ranks were stopped|"
                     r"exited with code|was killed by signal")
ROUND = re.compile(r"round (\d+): machine \d+ of (\d+) \(([^)]*)\)")


def rounds(text):
    """[(round, [hosts]), ...] as a machine's log shows them, with where each line ends."""
    return [(int(m.group(1)), m.group(3).split(", "), m.end()) for m in ROUND.finditer(text)]


def metric_lines(run_dir):
    try:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            return sum(1 for line in f if '"loss"' in line)
    except OSError:
        return 0


def verify_checkpoints(run_dir):
    """Problems of the checkpoints in run_dir/ckpt: each complete (its manifest), each piece
    inside its file and matching its checksum, each tensor's pieces covering it."""
    problems = []
    ckpts = sorted(glob.glob(os.path.join(run_dir, "ckpt", "step_*")))
    if not ckpts:
        return ["no checkpoint was left"]
    for c in ckpts:
        try:
            with open(os.path.join(c, "manifest.json")) as f:
                man = json.load(f)
        except (OSError, ValueError) as e:
            problems.append("%s: no readable manifest (%s)" % (os.path.basename(c), e))
            continue
        files = {}
        for name, t in man["tensors"].items():
            size = math.prod(t["shape"])
            covered = 0
            for p in t["pieces"]:
                if p["file"] not in files:
                    with open(os.path.join(c, p["file"]), "rb") as f:
                        files[p["file"]] = f.read()
                data = files[p["file"]][p["offset"]:p["offset"] + 4 * p["count"]]
                if len(data) != 4 * p["count"] or checksum64(data) != p["checksum"]:
                    problems.append("%s: a piece of %s fails its checksum" %
                                    (os.path.basename(c), name))
                covered += p["count"]
            if covered < size:
                problems.append("%s: %s's pieces hold %d of %d elements" %
                                (os.path.basename(c), name, covered, size))
    return problems


class Fault:
    def __init__(self, job, kind, machine, rng):
        self.job, self.kind, self.machine, self.rng = job, kind, machine, rng
        self.detect_s = self.resume_s = None
        self.outcome = ""  # "recovered" or "unaffected"
        self.problems, self.note = [], ""

    def check(self, ok, what):
        if not ok:
            self.problems.append(what)
        return ok


class Campaign:
    def __init__(self, args):
        self.loom, self.work = args.loom, args.workdir
        os.makedirs(self.work, exist_ok=True)
        ce.configure(self.loom, self.work)
        self.T = Trainer(self.loom, prepare_data(self.loom, self.work))
        ce.cluster("up", str(ETCD_MACHINE + 1))
        self.etcd = ce.EtcdMembers(places=[ETCD_MACHINE] * 3, tag="chaos-etcd")
        self.refs, self.ref_losses = {}, {}  # steps: (process, folder); steps: losses

    def close(self):
        for p, _ in self.refs.values():
            p.kill()
            p.wait()
        self.etcd.stop()
        ce.cluster("down")

    def start_reference(self, steps):
        """The uninterrupted run in one process, started beside the first job (whose fault
        handling mostly waits on leases and heartbeats); reference() collects it."""
        if steps not in self.refs:
            d = os.path.join(self.work, "ref_%d" % steps)
            shutil.rmtree(d, ignore_errors=True)
            p = subprocess.Popen(self.T.launch(1, d, *EXTRA, steps=steps),
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            self.refs[steps] = (p, d)

    def reference(self, steps):
        p, d = self.refs[steps]
        if steps not in self.ref_losses:
            out = p.communicate()[0]
            if p.returncode != 0:
                raise RuntimeError("the one-process reference run failed: " + out[-1000:])
            self.ref_losses[steps] = losses(d)
        return self.ref_losses[steps]

    # ---- one job ----
    def run_job(self, index, kinds, rng):
        steps = 30 + STEPS_PER_FAULT * len(kinds)
        d = os.path.join(self.work, "job%02d" % index)
        job = ce.RdzvJob(self.T, d, EXTRA, steps, "chaos-%d-%d" % (os.getpid(), index),
                         timeout_s=20, watchdog_s=10, rdzv=self.etcd.rdzv(), max_restarts=100)
        faults, problems = [], []
        self.start_reference(steps)
        try:
            for m in range(ce.MACHINES):
                job.launch(m, "start")
            if not until(lambda: ce.trained_steps(d) >= 3, 120):
                problems.append("the job did not train 3 steps:\n" + job.log(0)[-2000:])
                return faults, problems
            for i, kind in enumerate(kinds):
                if ce.trained_steps(d) > steps - 15:
                    problems.append("the job ran out of steps before fault %d (raise "
                                    "STEPS_PER_FAULT)" % i)
                    break
                victim = rng.randrange(ce.MACHINES)
                f = Fault(job, kind, victim, random.Random(rng.getrandbits(64)))
                f.note += "step %d; " % ce.trained_steps(d)
                t0 = time.time()
                try:
                    getattr(self, "fault_" + kind)(f)
                except Exception as e:  # a harness failure is a failed fault, not a crash
                    f.problems.append("harness: %r at %s" %
                                      (e, traceback.format_exc().splitlines()[-3]))
                print("  %-11s machine %d  %-4s detected %s, resumed %s (%.0f s) %s%s" % (
                    kind, victim, "ok" if not f.problems else "FAIL",
                    "-" if f.detect_s is None else "%.1f s" % f.detect_s,
                    "-" if f.resume_s is None else "%.1f s" % f.resume_s, time.time() - t0,
                    f.note, "".join("\n      - " + p for p in f.problems)), flush=True)
                faults.append(f)
                if f.problems:  # the job's state is unknown: end it here
                    break
            else:
                t_end = time.time()
                for m, p in job.procs.items():
                    try:
                        rc = p.wait(timeout=300)
                    except subprocess.TimeoutExpired:
                        rc = None
                    if rc != 0:
                        problems.append("machine %d's loom run ended %s:\n%s" %
                                        (m, rc, job.log(m)[-2000:]))
                t_ref = time.time()
                if not problems:
                    try:
                        want = self.reference(steps)
                    except RuntimeError as e:
                        problems.append(str(e))
                if not problems:
                    worst = worst_relative(losses(d), want)
                    if worst > TOL:
                        problems.append("the losses differ from one process's by %.1e" % worst)
                    problems += verify_checkpoints(d)
                    print("  job %d: %d steps (the last %.0f s after the last fault), losses "
                          "within %.1e of one process (%.0f s), %d checkpoints verified" %
                          (index, steps, t_ref - t_end, worst, time.time() - t_ref,
                           len(glob.glob(d + "/ckpt/step_*"))))
        finally:
            job.kill()
            for p in job.procs.values():
                p.wait()
            problems += self.left_behind(d)
        return faults, problems

    def left_behind(self, d):
        out = []
        if not until(lambda: not processes_mentioning(d), 10):
            out.append("processes of the job were left: %s" % processes_mentioning(d))
        for m in range(ce.MACHINES):
            ls = subprocess.run(["bash", ce.CLUSTER, "exec", str(m), "sh", "-c",
                                 "ls /dev/shm | grep '^loom' || true"],
                                capture_output=True, text=True).stdout.split()
            if ls:
                out.append("machine %d's /dev/shm keeps %s" % (m, ls))
                subprocess.run(["bash", ce.CLUSTER, "exec", str(m), "sh", "-c",
                                "rm -f /dev/shm/loom*"])
        return out

    # ---- watching a fault ----
    def current(self, job, m):
        """(round, hosts) of machine m's latest round."""
        r = rounds(job.log(m))
        return (r[-1][0], r[-1][1]) if r else (-1, [])

    def victim_names(self, job, survivor, victim):
        """Patterns that name the victim machine in the survivors' text: its host id, or the
        ranks it held in the current round."""
        _, hosts = self.current(job, survivor)
        host = "loomc-%d" % victim
        if host not in hosts:
            return re.compile(re.escape(host))
        i = hosts.index(host) * ce.PER_MACHINE
        ranks = "|".join(str(r) for r in range(i, i + ce.PER_MACHINE))
        return re.compile(r"%s\b|\brank (%s)\b" % (re.escape(host), ranks))

    def detect(self, f, job, survivors, since, t0, bound):
        """Until a survivor stops its ranks (its log since the fault): the seconds taken."""
        def seen():
            return any(STOPPED.search(job.log(m)[since[m]:]) for m in survivors)
        if f.check(until(seen, bound + 30, 0.05),
                   "no surviving machine stopped its ranks within %d s" % (bound + 30)):
            f.detect_s = time.time() - t0
            f.check(f.detect_s <= bound, "detected after %.1f s (bound %d s)" %
                    (f.detect_s, bound))
        return f.detect_s is not None

    def resumed(self, f, job, survivors, since, r0, t0, n_machines):
        """Until the survivors meet in a round after r0 with n_machines and train a step in
        it; checks each survivor named the victim in between."""
        def met():
            return all(any(r > r0 and len(h) == n_machines
                           for r, h, _ in rounds(job.log(m)[since[m]:])) for m in survivors)
        if not f.check(until(met, RESUME_S), "the survivors did not meet again within %d s:\n%s"
                       % (RESUME_S, job.log(survivors[0])[-1500:])):
            return False
        n = metric_lines(job.d)
        if not f.check(until(lambda: metric_lines(job.d) > n, RESUME_S),
                       "no step was trained after the survivors met again"):
            return False
        f.resume_s = time.time() - t0
        f.check(f.resume_s <= RESUME_S, "resumed after %.1f s (bound %d s)" %
                (f.resume_s, RESUME_S))
        return True

    def named_by_survivors(self, f, job, survivors, since, names):
        for m in survivors:
            text = job.log(m)[since[m]:]
            later = [end for r, _, end in rounds(text)]
            window = text[:later[0]] if later else text
            f.check(names[m].search(window), "machine %d did not name machine %d or its ranks "
                    "before its next round:\n%s" % (m, f.machine, window[-1500:]))

    def rejoined(self, f, job, since_round):
        """Until every machine is in a round after since_round with all 3 and trains."""
        def met():
            return all(self.current(job, m)[0] > since_round and
                       len(self.current(job, m)[1]) == ce.MACHINES for m in range(ce.MACHINES))
        if not f.check(until(met, 120), "machine %d was not admitted again within 120 s:\n%s" %
                       (f.machine, job.log(f.machine)[-1500:])):
            return
        n = metric_lines(job.d)
        f.check(until(lambda: metric_lines(job.d) >= n + 2, 60),
                "the 3 machines did not train after the machine came back")

    def machine_fault(self, f, inject, restore, live_victim, second=None):
        """The common course of a fault that takes one machine out: inject, detect, resume
        on the survivors, named, restore, rejoin."""
        job, v = f.job, f.machine
        survivors = [m for m in range(ce.MACHINES) if m != v]
        n = metric_lines(job.d)
        until(lambda: metric_lines(job.d) >= n + f.rng.randint(1, 3), 30, 0.02)  # mid-step
        since = {m: len(job.log(m)) for m in range(ce.MACHINES)}
        r0 = max(self.current(job, m)[0] for m in survivors)
        names = {m: self.victim_names(job, m, v) for m in survivors}
        t0 = time.time()
        inject()
        bound = DETECT_S.get(f.kind, DETECT_DEFAULT_S)
        if not self.detect(f, job, survivors, since, t0, bound):
            return
        if second:
            survivors, t0 = second(survivors, since)
            if survivors is None:
                return
        if not self.resumed(f, job, survivors, since, r0, t0, len(survivors)):
            return
        self.named_by_survivors(f, job, survivors, since, names)
        if live_victim:
            # The cut-off machine's own launcher must stop its ranks too (later than the
            # survivors where its calls to etcd first time out: 2 s per member).
            f.check(until(lambda: STOPPED.search(job.log(v)[since[v]:]), 30),
                    "machine %d (cut off) did not stop its ranks within %.0f s of the fault:\n%s"
                    % (v, time.time() - t0, job.log(v)[since[v]:][-1500:]))
        r1 = max(self.current(job, m)[0] for m in survivors)
        restore()
        self.rejoined(f, job, r1)
        f.outcome = "recovered"

    # ---- the faults ----
    def crash(self, f, second=None):
        """A machine crashed, then started again (its `loom run`, as an operator would)."""
        job, v = f.job, f.machine

        def restore():
            job.procs[v].wait()
            job.launch(v, "again%d" % len(job.logs))
        self.machine_fault(f, lambda: ce.cluster("kill", str(v)), restore, False, second)

    def fault_crash(self, f):
        self.crash(f)

    def cut_fault(self, f, cut):
        v = f.machine
        self.machine_fault(f, cut, lambda: ce.cluster("heal", str(v)), True)
        if f.job.procs[v].poll() is not None:
            f.check(False, "machine %d's loom run ended (%s) after its link came back; it "
                    "should rejoin:\n%s" % (v, f.job.procs[v].returncode,
                                            f.job.log(v)[-1500:]))

    def fault_link_down(self, f):
        self.cut_fault(f, lambda: ce.cluster("cut", str(f.machine)))

    def iptables(self, m, *rules):
        script = " && ".join("iptables " + r for r in rules)
        ce.cluster("exec", str(m), "sh", "-c", script)

    def fault_drop_both(self, f):
        self.cut_fault(f, lambda: self.iptables(f.machine, "-A INPUT -i eth0 -j DROP",
                                                "-A OUTPUT -o eth0 -j DROP"))

    def fault_drop_one(self, f):
        way = f.rng.choice(["INPUT -i", "OUTPUT -o"])
        f.note += "%s dropped; " % way.split()[0].lower()
        self.cut_fault(f, lambda: self.iptables(f.machine, "-A %s eth0 -j DROP" % way))

    def fault_etcd_cut(self, f):
        etcd = ce.addr(ETCD_MACHINE)
        self.cut_fault(f, lambda: self.iptables(f.machine, "-A OUTPUT -d %s -j DROP" % etcd,
                                                "-A INPUT -s %s -j DROP" % etcd))

    def fault_second(self, f):
        job, v = f.job, f.machine
        others = [m for m in range(ce.MACHINES) if m != v]
        v2 = f.rng.choice(others)

        def second(survivors, since):
            # While the survivors regroup: once v2 has started its ranks for the new round,
            # kill them all (a second fault during the recovery from the first).
            if not f.check(until(lambda: len(rounds(job.log(v2)[since[v2]:])) > 0, RESUME_S),
                           "machine %d did not start a new round" % v2):
                return None, None
            time.sleep(f.rng.uniform(0.0, 1.0))
            since2 = len(job.log(v2))
            ranks = children(job.procs[v2].pid)
            for pid in ranks:
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass
            f.note += "then machine %d's %d ranks killed while regrouping; " % (v2, len(ranks))
            t1 = time.time()
            f.check(until(lambda: "was killed by signal 9" in job.log(v2)[since2:] or
                          "exited with code" in job.log(v2)[since2:], 10),
                    "machine %d did not name its killed ranks" % v2)
            return survivors, t1

        self.crash(f, second)

    def no_restart_fault(self, f, inject, restore, steps, within_s):
        """A fault the job must ride out: `steps` steps trained while it lasts (within
        within_s seconds), then undone; no new round anywhere."""
        job = f.job
        r0 = {m: self.current(job, m)[0] for m in range(ce.MACHINES)}
        n = metric_lines(job.d)
        t0 = time.time()
        inject()
        went_on = until(lambda: metric_lines(job.d) >= n + steps, within_s, 0.05)
        took = time.time() - t0
        restore()
        f.check(went_on, "%d step(s) should be trained during the fault, %d were in %.0f s" %
                (steps, metric_lines(job.d) - n, took))
        f.note += "%d step(s) in %.1f s during it; " % (metric_lines(job.d) - n, took)
        n2 = metric_lines(job.d)
        f.check(until(lambda: metric_lines(job.d) >= n2 + 3, 60),
                "training did not go on after the fault was undone")
        changed = [m for m in range(ce.MACHINES) if self.current(job, m)[0] != r0[m]]
        f.check(not changed, "machines %s met in a new round (a restart):\n%s" %
                (changed, job.log(changed[0])[-1500:] if changed else ""))
        f.outcome = "unaffected"

    def fault_slow(self, f):
        # A step moves 17.8 MB each way over the slowed link (ZeRO-1's reduce-scatter and
        # allgather of tiny's 13.2 MB, 2/3 of each crossing): ~12 s at 10 Mbit/s, within
        # the job's 20 s deadline per operation.
        v = f.machine
        self.no_restart_fault(f, lambda: ce.cluster("shape", str(v), "10mbit"),
                              lambda: ce.cluster("shape", str(v), "none"), 1, 60)

    def fault_etcd_member(self, f):
        e = self.etcd
        lead = e.leader()
        member = lead if f.rng.random() < 0.5 else f.rng.choice([i for i in range(3)
                                                                 if i != lead])
        f.note += "member e%d (%s); " % (member, "leader" if member == lead else "follower")

        def restore():
            e.start(member)
            e.wait_ready(member)
        self.no_restart_fault(f, lambda: e.kill(member), restore, 5, 30)


def table(faults, jobs_failed, n_jobs, seed, took):
    lines = ["| fault | runs | recovered (new round, resumed) | unaffected (no restart) | "
             "failed a check | time to detect (median / max) | time to resume (median / max) |",
             "|---|---|---|---|---|---|---|"]
    by = collections.OrderedDict((k, []) for k in KINDS)
    for f in faults:
        by[f.kind].append(f)

    def spread(xs):
        xs = [x for x in xs if x is not None]
        return "%.1f s / %.1f s" % (statistics.median(xs), max(xs)) if xs else "-"
    for k, fs in by.items():
        if fs:
            good = [f for f in fs if not f.problems]
            lines.append("| %s | %d | %d | %d | %d | %s | %s |" % (
                k, len(fs), sum(1 for f in good if f.outcome == "recovered"),
                sum(1 for f in good if f.outcome == "unaffected"), len(fs) - len(good),
                spread(f.detect_s for f in fs), spread(f.resume_s for f in fs)))
    bad = sum(1 for f in faults if f.problems)
    summary = ("%d faults in %d jobs, seed %d, %.0f s: %d passed every check, %d did not; "
               "%d job(s) failed an end-of-job check" % (len(faults), n_jobs, seed, took,
                                                         len(faults) - bad, bad, jobs_failed))
    return "\n".join(lines) + "\n\n" + summary + "\n"


def main():
    args = campaign_args("loom", "workdir")
    n = args.faults or (len(KINDS) if args.profile == "quick" else 56)
    rng = random.Random(args.seed)
    t_start = time.time()
    c = Campaign(args)
    faults, jobs_failed, index = [], 0, 0
    try:
        while len(faults) < n:
            kinds = KINDS[:]
            rng.shuffle(kinds)
            kinds = kinds[:n - len(faults)]
            print("job %d: %s" % (index, ", ".join(kinds)), flush=True)
            got, problems = c.run_job(index, kinds, random.Random(rng.getrandbits(64)))
            for p in problems:
                print("  FAIL job %d: %s" % (index, p), flush=True)
            jobs_failed += bool(problems)
            faults += got
            index += 1
            if len(got) < len(kinds):
                break  # a fault failed and ended its job, or the job ran out of steps
    finally:
        c.close()
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    if "loomc-" in left:
        print("FAIL: namespaces left after the campaign: " + left)
        jobs_failed += 1
    out = table(faults, jobs_failed, index, args.seed, time.time() - t_start)
    print("\n" + out)
    if args.table:
        with open(args.table, "w") as f:
            f.write(out)
    sys.exit(1 if jobs_failed or any(f.problems for f in faults) or len(faults) < n else 0)


if __name__ == "__main__":
    main()
