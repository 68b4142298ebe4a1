#!/usr/bin/python3
"""Data-parallel and ZeRO training end to end (`loom run`, mpirun), on the King James Bible.

  dp_e2e.py LOOM WORKDIR equivalence  20 steps, fp32, same seed and global batch: one process
                                      vs `loom run -n 2` and `-n 4` for ZeRO 0-3, recompute
                                      off and on: per-step losses equal within 1e-5 relative;
                                      model-state memory (allocator high-water mark) per rank
                                      within ZeRO's formulas
  dp_e2e.py LOOM WORKDIR resume       a checkpoint of 4 ranks / ZeRO-3 resumed by 2 ranks /
                                      ZeRO-1 and by one process (fp32 tolerance) and by the
                                      same layout (bit-identical); kill -9 during a save leaves
                                      the previous checkpoint loadable; kill -9 of a rank ends
                                      the job naming it, and with --max-restarts 1 the job
                                      finishes with the uninterrupted run's final loss; bad
                                      input fails on every rank and changes nothing; SIGINT
                                      to `loom run` saves and exits 130
  dp_e2e.py LOOM WORKDIR launchers    mpirun -np 2 and a 2-machine x 2-rank job (ranks started
                                      by hand with their own LOOM_HOST_ID) with
                                      zero.shard_group = node match the one-process losses
"""
import os
import re
import shutil
import signal
import subprocess
import sys

from common import (SANITIZED, TOL, Trainer, children, compare, copy_for_resume,  # noqa: E402
                    fail, free_port, kill_rank, losses, metrics, prepare_data, rank_pid,
                    resumed_losses, run, sanitized_cases, tree_digest, wait_for)

LOOM, WORK, MODE = sys.argv[1], sys.argv[2], sys.argv[3]


def train_args(run_dir, *extra, steps=20):
    return TRAINER.args(run_dir, *extra, steps=steps)


def train(run_dir, n=1, *extra, steps=20, rc=0):
    return TRAINER.train(run_dir, n, *extra, steps=steps, rc=rc)


# ---- tiny's unit sizes (src/loom/model/gpt.cc), for ZeRO's memory formulas ----
C, L, CTX, VP = 64, 2, 64, 50304
UNITS = [VP * C + CTX * C] + [12 * C * C + 13 * C] * L + [2 * C]
PSI = sum(UNITS)
MiB = 1 << 20


def padded(S):
    return sum(-(-u // S) * S for u in UNITS)


def memory_bound(zero, S):
    """Model-state bytes per rank (fp32 params, grads, Adam m and v: 16 bytes per parameter
    unsharded), and the allowance for transient buffers. Returns (expected, upper bound)."""
    pad = 16 * len(UNITS) * S  # per-unit padding to a multiple of S
    big = 4 * max(UNITS)
    if zero == 0 or S == 1:
        return 16 * PSI, 16 * PSI + pad
    if zero == 1:
        return 8 * PSI + 8 * PSI / S, 8 * PSI + 8 * PSI / S + pad
    if zero == 2:  # a unit's full gradient lives until its reduce-scatter lands
        return 4 * PSI + 12 * PSI / S, 4 * PSI + 12 * PSI / S + pad + 2 * big
    # stage 3: shards of everything plus two gathered units (parameters and gradients)
    return 16 * PSI / S, 16 * PSI / S + pad + 2 * 2 * big


def equivalence():
    table = []
    runs = [("n=%d zero=%d recompute=%s" % (n, zero, rc), n, zero, rc)
            for rc in ("none", "all") for n in (2, 4) for zero in (0, 1, 2, 3)]
    runs = sanitized_cases(runs, {"n=2 zero=0 recompute=none", "n=2 zero=3 recompute=none",
                                  "n=4 zero=1 recompute=none", "n=4 zero=2 recompute=none",
                                  "n=4 zero=3 recompute=all"})
    for recompute in ("none", "all"):
        base_dir = os.path.join(WORK, "eq_1_%s" % recompute)
        train(base_dir, 1, "--set", "train.recompute=" + recompute)
        base = losses(base_dir)
        for name, n, zero, _ in (r for r in runs if r[3] == recompute):
            d = os.path.join(WORK, "eq_%d_z%d_%s" % (n, zero, recompute))
            train(d, n, "--set", "train.zero=%d" % zero, "--set", "train.recompute=" + recompute)
            compare(name, losses(d), base)
            last = metrics(d)[-1]
            if len(last["state_peak_mb"]) != n or len(last["rss_peak_mb"]) != n:
                fail("metrics.jsonl should hold one memory figure per rank: %s" % last)
            if "comm_wait_ms" not in last:
                fail("metrics.jsonl lacks comm_wait_ms")
            if recompute == "none":
                table.append((n, zero, last["state_peak_mb"]))
    # Shared buffers (zero.shared_buffers = auto): ZeRO's reduce-scatters and allgathers
    # between the ranks of this machine are read in place from the senders' buffers (the
    # losses above); with it off every message goes through the rings, same losses.
    base = losses(os.path.join(WORK, "eq_1_none"))
    for name, n, zero, rc in runs:
        if zero >= 1 and rc == "none":
            d = os.path.join(WORK, "eq_%d_z%d_none" % (n, zero))
            moved = sum(sum(m["comm_in_place_mb"]) for m in metrics(d))
            if moved <= 0:
                fail("%s: no gradient or parameter was read in place (comm_in_place_mb)" % name)
            print("ok  %s read %.0f MiB in place" % (name, moved))
    d = os.path.join(WORK, "eq_shared_off")
    train(d, 2, "--set", "train.zero=3", "--set", "zero.shared_buffers=off")
    compare("n=2 zero=3 zero.shared_buffers=off", losses(d), base)
    if any(sum(m["comm_in_place_mb"]) for m in metrics(d)):
        fail("zero.shared_buffers=off still read messages in place")
    # The shared gather (zero.shared_gather = auto, the ZeRO-3 runs above): units gathered
    # into one buffer per machine that its ranks all read, each rank accounting for its
    # share; off, a copy per rank: the same losses and more model state per rank.
    d = os.path.join(WORK, "eq_gather_per_rank")
    train(d, 2, "--set", "train.zero=3", "--set", "zero.shared_gather=off")
    compare("n=2 zero=3 zero.shared_gather=off", losses(d), base)
    per_rank = metrics(d)[-1]["state_peak_mb"]
    shared = metrics(os.path.join(WORK, "eq_2_z3_none"))[-1]["state_peak_mb"]
    if not max(shared) < min(per_rank):
        fail("n=2 zero=3: model state with the shared gather %s MiB, not below a gathered "
             "copy per rank %s MiB" % (shared, per_rank))
    print("ok  n=2 zero=3 model state per rank: shared gather %s MiB, per rank %s MiB" %
          (shared, per_rank))
    # Gradient reductions in bf16 (sums of the reduced values stay fp32): close, not equal.
    for zero in (3,) if SANITIZED else (0, 3):
        d = os.path.join(WORK, "eq_bf16_z%d" % zero)
        train(d, 2, "--set", "train.zero=%d" % zero, "--set", "zero.comm_dtype=bf16")
        got = losses(d)
        compare("n=2 zero=%d comm in bf16" % zero, got, base, tol=1e-2)
        # ... and not the fp32 run's losses: bf16 rounding must show, or the setting was
        # ignored (fp32 reductions reproduce the one-process losses to ~1e-6).
        fp32 = losses(os.path.join(WORK, "eq_2_z%d_none" % zero))
        moved = max(abs(got[s] - fp32[s]) / abs(fp32[s]) for s in fp32)
        if moved < 1e-5:
            fail("n=2 zero=%d: zero.comm_dtype=bf16 gave the fp32 losses (max rel diff %.1e): "
                 "the reductions did not run in bf16" % (zero, moved))
        print("ok  n=2 zero=%d comm in bf16 differs from fp32 by %.1e" % (zero, moved))
    # optim.lr_scale = linear: the peak LR times the data-parallel size (Horovod's rule).
    d = os.path.join(WORK, "eq_lr_linear")
    train(d, 2, "--set", "optim.lr_scale=linear", steps=8)
    got = {m["step"]: m["lr"] for m in metrics(d) if "lr" in m}
    want = {m["step"]: m["lr"] for m in metrics(os.path.join(WORK, "eq_1_none")) if "lr" in m}
    if any(abs(got[s] - 2 * want[s]) > 1e-12 * want[s] for s in range(1, 6)):
        fail("lr_scale=linear on 2 ranks: lr %s, expected twice %s" % (got, want))
    print("ok  optim.lr_scale=linear doubles the LR on 2 ranks")

    # Memory: every rank's high-water mark of model-state buffers within the formula.
    one = metrics(os.path.join(WORK, "eq_1_none"))[-1]["state_peak_mb"][0] * MiB
    exp1, hi1 = memory_bound(0, 1)
    if not exp1 <= one <= hi1:
        fail("one process holds %.0f bytes of model state, expected 16 x %d" % (one, PSI))
    print("model state per rank (MiB), tiny, Psi = %d parameters:" % PSI)
    for n, zero, per_rank in table:
        expected, bound = memory_bound(zero, n)
        for r, mb in enumerate(per_rank):
            if not expected * 0.999 <= mb * MiB <= bound:
                fail("n=%d zero=%d rank %d: %.2f MiB of model state, formula %.2f MiB, bound "
                     "%.2f MiB" % (n, zero, r, mb, expected / MiB, bound / MiB))
        print("  n=%d zero=%d  measured %s  formula %.2f  bound %.2f" %
              (n, zero, " ".join("%.2f" % x for x in per_rank), expected / MiB, bound / MiB))
    if SANITIZED:  # the orders below compare runs the release pass makes
        return
    z0 = dict(((n, z), v[0]) for n, z, v in table)
    # (tiny keeps 97% of its parameters in unit 0, the tied embedding, so the gathered
    # unit of stages 2-3 costs about what sharding saves: only these orders hold for it.)
    if not (z0[(4, 1)] < z0[(4, 0)] and z0[(4, 3)] < z0[(4, 0)] and z0[(4, 3)] < z0[(2, 3)]):
        fail("model state should shrink with sharding: %s" % z0)


def resume():
    # Uninterrupted reference: 4 ranks, ZeRO-3, checkpoints at 10 and 20.
    ref = os.path.join(WORK, "rs_ref")
    train(ref, 4, "--set", "train.zero=3", "--set", "ckpt.every=10")
    want = losses(ref)
    later = list(range(11, 21))
    for n, zero, tol in ((2, 1, TOL), (1, 0, TOL), (4, 3, 0.0), (2, 3, TOL)):
        d = os.path.join(WORK, "rs_%d_%d" % (n, zero))
        copy_for_resume(ref, d)
        train(d, n, "--set", "train.zero=%d" % zero, "--set", "ckpt.every=10", "--resume")
        got = resumed_losses(d)
        compare("resume 4 ranks zero 3 -> %d ranks zero %d" % (n, zero),
                {s: got[s] for s in later}, want, tol, later)
        if tol == 0.0 and any(got[s] != want[s] for s in want):
            fail("same layout: resumed losses must be bit-identical")

    # kill -9 during a save: the previous checkpoint stays complete and loadable.
    d = os.path.join(WORK, "rs_killsave")
    shutil.rmtree(d, ignore_errors=True)
    env = dict(os.environ, LOOM_TEST_SAVE_PAUSE_S="30")
    cmd = [LOOM, "run", "-n", "2", LOOM] + train_args(d, "--set", "train.zero=2",
                                                       "--set", "ckpt.every=10")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=env)
    for line in p.stdout:  # kill the ranks inside the first save's window
        if "checkpoint step 10 data written" in line:
            break
    for c in children(p.pid):
        os.kill(c, signal.SIGKILL)
    p.wait(timeout=30)
    if p.returncode == 0:
        fail("loom run should fail when its ranks are killed")
    ck = os.path.join(d, "ckpt")
    if [x for x in os.listdir(ck) if x.startswith("step_")]:
        fail("a checkpoint killed before its manifest must not appear complete: %s" %
             os.listdir(ck))
    # ... and with one complete checkpoint present, a killed second save leaves it intact.
    d2 = os.path.join(WORK, "rs_killsave2")
    copy_for_resume(ref, d2)
    p = subprocess.Popen([LOOM, "run", "-n", "2", LOOM] +
                         train_args(d2, "--set", "train.zero=1", "--set", "ckpt.every=10",
                                    "--resume"),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    for line in p.stdout:
        if "checkpoint step 20 data written" in line:
            break
    for c in children(p.pid):
        os.kill(c, signal.SIGKILL)
    p.wait(timeout=30)
    complete = sorted(x for x in os.listdir(os.path.join(d2, "ckpt")) if x.startswith("step_"))
    if complete != ["step_00000010"]:
        fail("after a kill during the step-20 save, expected only step_00000010: %s" % complete)
    train(d2, 2, "--set", "train.zero=1", "--resume")
    got = resumed_losses(d2)
    compare("resume after a kill during save", {s: got[s] for s in later}, want, TOL, later)

    # kill -9 of one rank mid-step: the job ends, naming the rank.
    d = os.path.join(WORK, "rs_killrank")
    shutil.rmtree(d, ignore_errors=True)
    cmd = [LOOM, "run", "-n", "2", LOOM] + train_args(d, "--set", "train.zero=0",
                                                       "--set", "ckpt.every=10", steps=400)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: os.path.exists(os.path.join(d, "ckpt", "step_00000010")), 120,
             "the first checkpoint")
    took = kill_rank(p, 1)
    print("ok  kill -9 of rank 1: job ended in %.1f s naming it" % took)

    # ... and with --max-restarts 1 it resumes and ends with the uninterrupted final loss.
    ref2 = os.path.join(WORK, "rs_ref2")
    shutil.rmtree(ref2, ignore_errors=True)
    train(ref2, 2, "--set", "ckpt.every=10", steps=40)
    d = os.path.join(WORK, "rs_restart")
    shutil.rmtree(d, ignore_errors=True)
    cmd = [LOOM, "run", "-n", "2", "--max-restarts", "1", LOOM] + train_args(
        d, "--set", "ckpt.every=10", steps=40)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: os.path.exists(os.path.join(d, "ckpt", "step_00000010")), 120,
             "the first checkpoint")
    os.kill(rank_pid(p.pid, 1), signal.SIGKILL)
    out, err = p.communicate(timeout=300)
    if p.returncode != 0 or "restarting from the latest checkpoint (restart 1 of 1)" not in err:
        fail("--max-restarts 1 should restart and finish:\nrc %d\n%s" % (p.returncode, err[-2000:]))
    a, b = losses(ref2), losses(d)
    if b[40] != a[40]:
        fail("restarted job's final loss %r differs from the uninterrupted %r" % (b[40], a[40]))
    print("ok  --max-restarts 1 after kill -9: final loss %r equals the uninterrupted run" % b[40])

    # Bad input: one clear error on every rank, non-zero exit, nothing changed.
    before = tree_digest(ref)
    cases = [
        ("global batch that does not divide", ref, ["--set", "train.global_batch=6"],
         "train.global_batch = 6 is not a multiple"),
        ("missing data path", os.path.join(WORK, "rs_nodata"),
         ["--set", "data.path=" + os.path.join(WORK, "no-such-data")], "is not a folder"),
        ("checkpoint of another model", ref, ["--set", "model.name=small", "--resume"],
         "checkpoint " + os.path.join(ref, "ckpt")),
    ]
    for name, d, extra, msg in cases:
        p = run([LOOM, "run", "-n", "2", LOOM] + train_args(d) + extra, expect_rc=None)
        if p.returncode == 0:
            fail(name + ": should fail")
        for r in (0, 1):
            if not re.search(r"\[rank %d\] loom: error: .*%s" % (r, re.escape(msg)), p.stderr):
                fail("%s: rank %d should print the error:\n%s" % (name, r, p.stderr[-2000:]))
        if "[rank 0] hint: " not in p.stderr:
            fail(name + ": no hint")
        print("ok  bad input (%s): error on every rank, exit %d" % (name, p.returncode))
    if tree_digest(ref) != before:
        fail("a failed start changed the run directory")

    # SIGINT to loom run: ranks agree on a step, save, exit 130; --resume finishes the run.
    d = os.path.join(WORK, "rs_sigint")
    shutil.rmtree(d, ignore_errors=True)
    p = subprocess.Popen([LOOM, "run", "-n", "2", LOOM] + train_args(d, "--set", "train.zero=3"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: os.path.exists(os.path.join(d, "metrics.jsonl")) and
             os.path.getsize(os.path.join(d, "metrics.jsonl")) > 0, 120, "the first step")
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    if p.returncode != 130:
        fail("SIGINT: loom run exited %d, expected 130\n%s" % (p.returncode, err[-2000:]))
    # It saved: the step it names has a checkpoint, the metrics end there, and the resumed
    # run starts from it (a SIGINT that saved nothing would resume from scratch and still
    # give the same losses).
    m = re.search(r"stopped by a signal after step (\d+); checkpoint saved", out + err)
    if not m:
        fail("SIGINT: no 'stopped by a signal after step N; checkpoint saved' line:\n" + out + err)
    n = int(m.group(1))
    if not os.path.isdir(os.path.join(d, "ckpt", "step_%08d" % n)) or max(losses(d)) != n:
        fail("SIGINT: no checkpoint of step %d, or the metrics do not end there" % n)
    resumed = run([LOOM, "run", "-n", "2", LOOM] +
                  [a for a in train_args(d, "--set", "train.zero=3", "--resume") if a != "--quiet"])
    if "(step %d)" % n not in resumed.stdout or "resumed from" not in resumed.stdout:
        fail("the run after SIGINT should resume from step %d:\n%s" % (n, resumed.stdout[-2000:]))
    compare("SIGINT then --resume", losses(d), want, TOL)
    print("ok  SIGINT saved step %d, --resume continued from it" % n)


def run_ranks(what, cmd, envs):
    """Starts one process per entry of envs (the environment a scheduler would give that
    rank) and waits for all of them to succeed."""
    procs = [subprocess.Popen(cmd, env=dict(os.environ, **e), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for e in envs]
    for r, p in enumerate(procs):
        out, err = p.communicate(timeout=300)
        if p.returncode != 0:
            fail("%s: rank %d exited %d:\n%s" % (what, r, p.returncode, err[-2000:]))


def launchers():
    base_dir = os.path.join(WORK, "ln_base")
    shutil.rmtree(base_dir, ignore_errors=True)
    train(base_dir, 1)
    base = losses(base_dir)
    d = os.path.join(WORK, "ln_mpi")
    TRAINER.mpirun(2, d, "--set", "train.zero=2")
    compare("mpirun -np 2 zero=2", losses(d), base)

    # The environment Slurm's srun gives its tasks (no Slurm here: the variables are what
    # the bootstrap reads; tests/unit/bootstrap_test.cc covers their parsing).
    d = os.path.join(WORK, "ln_slurm")
    shutil.rmtree(d, ignore_errors=True)
    port = free_port()
    run_ranks("srun-style", [LOOM] + train_args(d, "--set", "train.zero=1"), [
        dict(SLURM_PROCID=str(r), SLURM_NTASKS="2", SLURM_LOCALID=str(r),
             SLURM_NTASKS_PER_NODE="2", SLURM_JOB_NUM_NODES="1", SLURM_JOB_ID="4242",
             SLURM_JOB_NODELIST="localhost", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        for r in range(2)])
    compare("srun environment, 2 tasks, zero=1", losses(d), base)

    # Two "machines" of two ranks each: the ranks are started by hand, as a cluster
    # scheduler would, with LOOM_HOST_ID naming their machine. Across machines the ranks
    # talk TCP; ZeRO shards within a machine and replicates across.
    d = os.path.join(WORK, "ln_node")
    shutil.rmtree(d, ignore_errors=True)
    port = free_port()
    run_ranks("2x2", [LOOM] + train_args(d, "--set", "train.zero=3",
                                         "--set", "zero.shard_group=node"), [
        dict(LOOM_RANK=str(r), LOOM_WORLD_SIZE="4", LOOM_LOCAL_RANK=str(r % 2),
             LOOM_LOCAL_WORLD_SIZE="2", LOOM_STORE="tcp://127.0.0.1:%d" % port,
             LOOM_JOB_TOKEN="dp-e2e-token", LOOM_HOST_ID="machine%d" % (r // 2))
        for r in range(4)])
    compare("2 machines x 2 ranks, zero=3 shard_group=node", losses(d), base)
    # Sharded over the 2 ranks of a machine, not over all 4: the per-rank model state is
    # stage 3's over 2.
    two = os.path.join(WORK, "ln_two")
    train(two, 2, "--set", "train.zero=3")
    four = os.path.join(WORK, "ln_four")
    train(four, 4, "--set", "train.zero=3")
    per_rank = metrics(d)[-1]["state_peak_mb"]
    want, not_want = metrics(two)[-1]["state_peak_mb"][0], metrics(four)[-1]["state_peak_mb"][0]
    if any(abs(mb - want) > 0.01 * want for mb in per_rank) or abs(want - not_want) < 0.05 * want:
        fail("shard_group=node: model state %s MiB per rank, expected a 2-rank ZeRO-3's %.2f "
             "(a 4-rank one holds %.2f)" % (per_rank, want, not_want))


TRAINER = Trainer(LOOM, prepare_data(LOOM, WORK))
{"equivalence": equivalence, "resume": resume, "launchers": launchers}[MODE]()
print("PASS", MODE)
