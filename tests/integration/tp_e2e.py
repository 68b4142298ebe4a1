#!/usr/bin/python3
"""Tensor parallelism end to end (`loom run`, mpirun), on the King James Bible.

  tp_e2e.py LOOM WORKDIR equivalence  20 steps, fp32, same seed and global batch: one process
                                      vs tp 2, tp 2 x dp 2 with ZeRO 1 and 3, tp 4, tp 2
                                      with sequence parallelism and recompute, the spread
                                      placement, mpirun: per-step losses within 1e-5
                                      relative; bf16 close; the layout in the first log line;
                                      sequence parallelism lowers activation memory
  tp_e2e.py LOOM WORKDIR resume       a tp 2 x dp 2 checkpoint resumed as tp 1 x dp 4, as one
                                      process, as tp 4 and as itself (bit-identical); a
                                      one-process checkpoint resumed as tp 2 x dp 2 ZeRO-3
                                      with sequence parallelism; bad layouts and a checkpoint
                                      of another model fail on every rank and write nothing
"""
import os
import re
import shutil
import sys

from common import (SANITIZED, Trainer, compare, fail, losses, metrics, prepare_data,  # noqa: E402
                    run, sanitized_cases, tree_digest)

LOOM, WORK, MODE = sys.argv[1], sys.argv[2], sys.argv[3]


def tp_set(tp, zero=0, *extra):
    return ["--set", "train.tp=%d" % tp, "--set", "train.zero=%d" % zero, *extra]


def equivalence():
    base_dir = os.path.join(WORK, "eq_1")
    T.train(base_dir, 1)
    base = losses(base_dir)
    cases = [
        ("tp=2", 2, tp_set(2)),
        ("tp=2 dp=2 zero=0", 4, tp_set(2, 0)),
        ("tp=2 dp=2 zero=1", 4, tp_set(2, 1)),
        ("tp=2 dp=2 zero=3", 4, tp_set(2, 3)),
        ("tp=4", 4, tp_set(4)),
        ("tp=2 sequence parallel, recompute all", 2,
         tp_set(2, 0, "--set", "tp.sequence_parallel=true", "--set", "train.recompute=all")),
        ("tp=2 dp=2 zero=2 placement spread (TPD)", 4,
         tp_set(2, 2, "--set", "train.placement=spread")),
        ("tp=2 dp=2 zero=3 sequence parallel", 4,
         tp_set(2, 3, "--set", "tp.sequence_parallel=true")),
    ]
    cases = sanitized_cases(cases, {"tp=2 dp=2 zero=1", "tp=4",
                                    "tp=2 sequence parallel, recompute all",
                                    "tp=2 dp=2 zero=3 sequence parallel"})
    for name, n, extra in cases:
        d = os.path.join(WORK, "eq_" + re.sub(r"\W+", "_", name))
        T.train(d, n, *extra)
        compare(name, losses(d), base)
        last = metrics(d)[-1]
        for key in ("tp_comm_ms", "tp_comm_mb", "activation_mb", "block_activation_mb"):
            if key not in last:
                fail("%s: metrics.jsonl lacks %s: %s" % (name, key, last))
        if len(last["activation_mb"]) != n:
            fail("%s: one activation figure per rank expected: %s" % (name, last))
    if SANITIZED:  # the activation formulas, bf16, logs and mpirun are the release pass's
        return

    # Sequence parallelism splits the LayerNorm/residual regions: the blocks keep less.
    plain = metrics(os.path.join(WORK, "eq_tp_2"))[-1]["block_activation_mb"][0]
    sp = os.path.join(WORK, "eq_sp")
    T.train(sp, 2, *tp_set(2, 0, "--set", "tp.sequence_parallel=true"))
    compare("tp=2 sequence parallel", losses(sp), base)
    split = metrics(sp)[-1]["block_activation_mb"][0]
    # loom's per-layer accounting (fp32, no dropout; Korthikanti et al.'s terms without the
    # masks): the residual input, ln1, res2 and ln2 (sbh each), qkv, atty, fch, gelu(fch)
    # (12sbh/t), the LayerNorm statistics (4sb) and the softmax (as^2b/t); sequence
    # parallelism divides all of it by t.
    s_, b_, h_, a_, layers, t = 32, 2, 64, 4, 2, 2
    per_layer = s_ * b_ * h_ * (4 + 12 / t) + 4 * s_ * b_ + a_ * s_ * s_ * b_ / t
    per_layer_sp = (s_ * b_ * h_ * 16 + 4 * s_ * b_ + a_ * s_ * s_ * b_) / t
    for name, got, floats in (("tp 2", plain, per_layer), ("tp 2 + sequence parallel", split,
                                                           per_layer_sp)):
        want = 4 * layers * floats / (1 << 20)
        if abs(got - want) > 1e-9:
            fail("%s: the blocks keep %.6f MiB of activations, the formula says %.6f" %
                 (name, got, want))
    print("ok  block activations per rank: tp 2 %.3f MiB, with sequence parallelism %.3f "
          "(the formulas exactly)" % (plain, split))

    # bf16 products: one process and tp 2 round the same operands, the reductions differ.
    b1, b2 = os.path.join(WORK, "eq_bf16_1"), os.path.join(WORK, "eq_bf16_tp2")
    T.train(b1, 1, "--set", "train.dtype=bf16")
    T.train(b2, 2, *tp_set(2, 1, "--set", "train.dtype=bf16"))
    compare("tp=2 bf16 vs one process bf16", losses(b2), losses(b1), tol=1e-4)
    # ... and not fp32's losses: an ignored train.dtype = bf16 would pass the comparison
    # above (both runs in fp32 agree to ~1e-7), so bf16's rounding must show.
    fp32 = losses(base_dir)
    moved = max(abs(losses(b1)[s] - fp32[s]) / abs(fp32[s]) for s in fp32)
    if moved < 1e-5:
        fail("train.dtype = bf16 gave fp32's losses (max rel diff %.1e): bf16 was not used" % moved)
    print("ok  bf16 differs from fp32 by %.1e (max relative over the steps)" % moved)

    # The first log line names the layout (rank 0 prints it).
    d = os.path.join(WORK, "eq_log")
    shutil.rmtree(d, ignore_errors=True)
    p = run([a for a in T.launch(4, d, *tp_set(2), steps=2) if a != "--quiet"])
    want = "loom: layout world 4 = dp 2 x pp 1 x tp 2, placement DPT; tp groups [0 1] [2 3]; " \
           "dp groups [0 2] [1 3]"
    if want not in p.stdout:
        fail("the log should name the layout (%r):\n%s" % (want, p.stdout[-2000:]))
    print("ok  first log lines name the layout")

    # mpirun: the same job under OpenMPI's launcher.
    d = os.path.join(WORK, "eq_mpirun")
    T.mpirun(4, d, *tp_set(2, 2))
    compare("mpirun -np 4 tp=2 zero=2", losses(d), base)


def resume_from(ref, name, n, extra, want):
    return T.resume_from(WORK, ref, name, n, extra, want)


def resume():
    one = os.path.join(WORK, "rs_one")
    T.train(one, 1, "--set", "ckpt.every=10")
    want = losses(one)
    tpdp = os.path.join(WORK, "rs_tp2dp2")
    T.train(tpdp, 4, "--set", "ckpt.every=10", *tp_set(2, 1))
    compare("tp=2 dp=2 zero=1 (uninterrupted)", losses(tpdp), want)
    manifest = open(os.path.join(tpdp, "ckpt", "step_00000010", "manifest.json")).read()
    if '"start"' not in manifest or '"extent"' not in manifest:
        fail("a tensor-parallel checkpoint should hold boxes of its tensors")

    resume_from(tpdp, "tp2 x dp2 zero1 -> tp1 x dp4", 4, tp_set(1, 0), want)
    resume_from(tpdp, "tp2 x dp2 zero1 -> one process", 1, tp_set(1, 0), want)
    resume_from(tpdp, "tp2 x dp2 zero1 -> tp4 zero3", 4, tp_set(4, 3), want)
    same = resume_from(tpdp, "tp2 x dp2 zero1 -> itself", 4, tp_set(2, 1), want)
    if any(same[s] != losses(tpdp)[s] for s in same):
        fail("resuming the same layout must give bit-identical losses")
    print("ok  same layout resumed bit-identical")
    resume_from(one, "one process -> tp2 x dp2 zero3 sequence parallel", 4,
                tp_set(2, 3, "--set", "tp.sequence_parallel=true"), want)
    resume_from(one, "one process -> tp2", 2, tp_set(2, 0), want)
    # loom sample reads the whole tensors back from the tensor-parallel pieces.
    p = run([LOOM, "sample", "--ckpt", tpdp, "--prompt", "In the beginning", "-n", "8",
             "--temperature", "0"])
    if not p.stdout.startswith("In the beginning") or len(p.stdout.strip()) <= 16:
        fail("loom sample from a tp 2 x dp 2 checkpoint printed %r" % p.stdout)
    print("ok  loom sample from a tensor-parallel checkpoint: %r" % p.stdout.strip())

    # Bad input: one clear error on every rank, a non-zero exit, nothing written.
    before = tree_digest(tpdp)
    fresh = os.path.join(WORK, "rs_bad_fresh")
    shutil.rmtree(fresh, ignore_errors=True)
    cases = [
        ("tp not dividing the heads", 3, fresh, tp_set(3),
         "train.tp = 3 does not divide the 4 attention heads of tiny"),
        ("tp not dividing the world", 3, fresh, tp_set(2),
         "train.tp = 2 x train.pp = 1 = 2 does not divide the 3 ranks"),
        ("unknown placement letter", 2, fresh, tp_set(2, 0, "--set", "train.placement=DPX"),
         "unknown letter 'X'"),
        ("rows not splitting for sequence parallelism", 2, fresh,
         tp_set(2, 0, "--set", "tp.sequence_parallel=true", "--set", "train.seq_len=33",
                "--set", "train.micro_batch=1"), "which does not divide them"),
        ("checkpoint of another model", 2, tpdp,
         tp_set(2, 0, "--set", "model.name=small", "--resume"),
         "checkpoint " + os.path.join(tpdp, "ckpt")),
    ]
    for name, n, d, extra, msg in cases:
        p = run(T.launch(n, d, *extra), expect_rc=None)
        if p.returncode == 0:
            fail(name + ": should fail")
        for r in range(n):
            if not re.search(r"\[rank %d\] loom: error: .*%s" % (r, re.escape(msg)), p.stderr):
                fail("%s: rank %d should print the error:\n%s" % (name, r, p.stderr[-2000:]))
        if "[rank 0] hint: " not in p.stderr:
            fail(name + ": no hint")
        if os.path.exists(fresh):
            fail(name + ": a failed start created " + fresh)
        print("ok  bad input (%s): error on every rank, exit %d" % (name, p.returncode))
    if tree_digest(tpdp) != before:
        fail("a failed start changed the run directory")


T = Trainer(LOOM, prepare_data(LOOM, WORK))
{"equivalence": equivalence, "resume": resume}[MODE]()
print("PASS", MODE)
