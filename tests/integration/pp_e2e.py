#!/usr/bin/python3
"""Pipeline parallelism end to end (`loom run`), on the King James Bible.

  pp_e2e.py LOOM WORKDIR equivalence  20 steps, fp32, same seed and global batch: one process
                                      vs pp 2 with each schedule (gpipe, 1f1b, interleaved
                                      with 2 chunks per stage, zb-h1), pp 4 interleaved
                                      (`small`), pp 2 x dp 2 with ZeRO 0-3, pp 2 x tp 2
                                      with sequence parallelism, recompute and zb-h1, gpipe
                                      with 2 active microbatches, with activation offload:
                                      per-step losses within 1e-5 relative; the cap and
                                      offload cut the first stage's activations
  pp_e2e.py LOOM WORKDIR resume       a pp 2 checkpoint resumed by one process and by pp 4,
                                      a one-process checkpoint by pp 2 x dp 2; a rank killed
                                      mid-step ends the job naming it; bad pipeline layouts
                                      fail on every rank and write nothing
"""
import os
import re
import shutil
import subprocess
import sys

from common import (SANITIZED, Trainer, compare, cpu_info, fail, kill_rank, losses,  # noqa: E402
                    metrics, prepare_data, run, sanitized_cases, wait_for)

LOOM, WORK, MODE = sys.argv[1], sys.argv[2], sys.argv[3]


HEAD_SPLIT = ("--set", "pp.head_split=true")


def reads_bf16():
    """Whether this CPU's bf16 products read bf16 copies of their operands (Gemm::reads_bf16:
    oneDNN has a bf16 matmul here, AVX-512 core or later); where not (AVX2 only), they widen
    the rounded fp32 weights and the master in memory keeps no bf16 copies."""
    flags = set(cpu_info().get("flags", "").split())
    return all(x in flags for x in ("avx512f", "avx512bw", "avx512vl", "avx512dq"))


READS_BF16 = reads_bf16()


def pp_set(pp, schedule="1f1b", *extra):
    return ["--set", "train.pp=%d" % pp, "--set", "pp.schedule=" + schedule, *extra]


def slug(name):
    return re.sub(r"\W+", "_", name)


def equivalence():
    base_dir = os.path.join(WORK, "eq_1")
    T.train(base_dir, 1)
    base = losses(base_dir)
    cases = [
        ("pp=2 gpipe", 2, pp_set(2, "gpipe")),
        ("pp=2 1f1b", 2, pp_set(2, "1f1b")),
        ("pp=2 interleaved, 2 chunks per stage", 2,
         pp_set(2, "interleaved", "--set", "pp.virtual_stages=2")),
        ("pp=2 zb-h1", 2, pp_set(2, "zb-h1")),
        ("pp=2 x dp=2 zero=0", 4, pp_set(2, "1f1b", "--set", "train.zero=0")),
        ("pp=2 x dp=2 zero=1 zb-h1", 4, pp_set(2, "zb-h1", "--set", "train.zero=1")),
        ("pp=2 x dp=2 zero=2", 4, pp_set(2, "1f1b", "--set", "train.zero=2")),
        ("pp=2 x dp=2 zero=3 interleaved", 4,
         pp_set(2, "interleaved", "--set", "pp.virtual_stages=2", "--set", "train.zero=3")),
        ("pp=2 x tp=2 sequence parallel, recompute, zb-h1", 4,
         pp_set(2, "zb-h1", "--set", "train.tp=2", "--set", "tp.sequence_parallel=true",
                "--set", "train.recompute=all")),
        ("pp=2 given split [1, 3]", 2, pp_set(2, "1f1b", "--set", "pp.split=[1, 3]")),
        ("pp=2 gpipe, 2 active microbatches", 2,
         pp_set(2, "gpipe", "--set", "pp.active_microbatches=2")),
        ("pp=2 gpipe, activation offload", 2,
         pp_set(2, "gpipe", "--set", "train.offload_activations=true", "--set",
                "train.activation_loading_horizon=1")),
        ("pp=2 zb-h1, activation offload, recompute, horizon 1", 2,
         pp_set(2, "zb-h1", "--set", "train.offload_activations=true", "--set",
                "train.recompute=all", "--set", "train.activation_loading_horizon=1")),
        ("pp=2 x dp=2 zero=1, activation and optimizer offload", 4,
         pp_set(2, "1f1b", "--set", "train.zero=1", "--set", "train.offload_activations=true",
                "--set", "zero.offload=disk")),
        # The showcase's layout, whose optimizer step overlaps the next step (zero.overlap_step,
        # ZeRO 0), and ZeRO 0's gradient allreduce beside the overlapped step.
        ("pp=4 1f1b, recompute, activation and optimizer offload", 4,
         pp_set(4, "1f1b", "--set", "train.recompute=all", "--set",
                "train.offload_activations=true", "--set", "zero.offload=disk")),
        ("pp=2 x dp=2 zero=0, optimizer offload", 4,
         pp_set(2, "zb-h1", "--set", "zero.offload=disk")),
        # The head split (stage 0 runs the tied head for a share of each microbatch's rows):
        # not bit-identical (the head's weight gradient is two partial products, summed), so
        # within the tolerance.
        ("pp=2 1f1b, head split", 2, pp_set(2, "1f1b", *HEAD_SPLIT)),
        ("pp=2 zb-h1, head split", 2, pp_set(2, "zb-h1", *HEAD_SPLIT)),
        ("pp=2 gpipe, head split, recompute", 2,
         pp_set(2, "gpipe", *HEAD_SPLIT, "--set", "train.recompute=all")),
        ("pp=4 1f1b, head split", 4, pp_set(4, "1f1b", *HEAD_SPLIT)),
        ("pp=2 interleaved, 2 chunks per stage, head split", 2,
         pp_set(2, "interleaved", "--set", "pp.virtual_stages=2", *HEAD_SPLIT)),
        ("pp=2 x dp=2 zero=1, head split", 4, pp_set(2, "1f1b", *HEAD_SPLIT, "--set",
                                                     "train.zero=1")),
        ("pp=2 x dp=2 zero=2 zb-h1, head split", 4,
         pp_set(2, "zb-h1", *HEAD_SPLIT, "--set", "train.zero=2")),
        ("pp=2 x dp=2 zero=3, head split", 4, pp_set(2, "1f1b", *HEAD_SPLIT, "--set",
                                                     "train.zero=3")),
        ("pp=2 given split [1, 3], head split", 2,
         pp_set(2, "1f1b", "--set", "pp.split=[1, 3]", *HEAD_SPLIT)),
    ]
    cases = sanitized_cases(cases, {
        "pp=2 gpipe", "pp=2 x dp=2 zero=1 zb-h1", "pp=2 x dp=2 zero=3 interleaved",
        "pp=2 x tp=2 sequence parallel, recompute, zb-h1", "pp=2 gpipe, 2 active microbatches",
        "pp=2 x dp=2 zero=1, activation and optimizer offload", "pp=2 zb-h1, head split",
        "pp=2 x dp=2 zero=0, optimizer offload",
        "pp=2 x dp=2 zero=3, head split"})
    for name, n, extra in cases:
        d = os.path.join(WORK, "eq_" + slug(name))
        T.train(d, n, *extra)
        compare(name, losses(d), base)
    if SANITIZED:  # the memory figures and logs below are the release pass's
        master_offload()
        return

    # Offload: the first stage of GPipe holds all 4 microbatches; spilled (at most one write
    # behind, horizon 1), about two stay in memory. The spill files are gone after the run.
    held = metrics(os.path.join(WORK, "eq_pp_2_gpipe"))[-1]["activation_mb"][0]
    spilled = metrics(os.path.join(WORK, "eq_pp_2_gpipe_activation_offload"))[-1]
    if not spilled["activation_mb"][0] < 0.75 * held:
        fail("activation offload should cut stage 0's activations: %.2f MiB vs %.2f" %
             (spilled["activation_mb"][0], held))
    # pp.active_microbatches = 2: GPipe in rounds of 2 holds half of its 4 microbatches.
    capped = metrics(os.path.join(WORK, "eq_pp_2_gpipe_2_active_microbatches"))[-1]
    if not capped["activation_mb"][0] < 0.6 * held:
        fail("2 active microbatches should halve gpipe's stage 0 activations: %.2f MiB vs %.2f" %
             (capped["activation_mb"][0], held))
    print("ok  gpipe stage 0 activations: %.2f MiB for 4 microbatches, %.2f with 2 active" %
          (held, capped["activation_mb"][0]))
    left = os.listdir(os.path.join(WORK, "eq_pp_2_gpipe_activation_offload", "spill"))
    if left:
        fail("spill files left behind: %s" % left)
    print("ok  gpipe stage 0 activations: %.2f MiB held, %.2f with offload (%.1f MiB spilled "
          "per step)" % (held, spilled["activation_mb"][0], spilled["offload_mb"][0]))

    # Optimizer-state offload on one process: the same losses, and Adam's 8 bytes per
    # parameter leave the model state (16 -> 8 bytes per parameter) for a file.
    d = os.path.join(WORK, "eq_zero_offload")
    T.train(d, 1, "--set", "zero.offload=disk")
    compare("one process, optimizer state on disk", losses(d), base)
    with_file = metrics(d)[-1]
    in_memory = metrics(base_dir)[-1]["state_peak_mb"][0]
    ratio = with_file["state_peak_mb"][0] / in_memory
    if not 0.49 < ratio < 0.51:
        fail("zero.offload=disk should halve the model state: %.2f of %.2f MiB" %
             (with_file["state_peak_mb"][0], in_memory))
    if os.listdir(os.path.join(d, "offload")):
        fail("the optimizer-state file should be gone after the run")
    print("ok  optimizer state on disk: model state %.1f of %.1f MiB, %.1f MiB moved per step"
          % (with_file["state_peak_mb"][0], in_memory, with_file["zero_offload_mb"][0]))
    # That run's step overlapped the next one (zero.overlap_step, on by default): the same
    # bits as the step run where it is called, which returns only when the step is done.
    d_sync = os.path.join(WORK, "eq_zero_offload_sync")
    T.train(d_sync, 1, "--set", "zero.offload=disk", "--set", "zero.overlap_step=false")
    compare("optimizer state on disk, overlapped step vs in place", losses(d), losses(d_sync),
            tol=0)
    overlapped, in_place = with_file["optim_ms"][0], metrics(d_sync)[-1]["optim_ms"][0]
    if not overlapped < 0.5 * in_place:
        fail("the overlapped step should return at once: optimizer %.1f ms vs %.1f in place" %
             (overlapped, in_place))
    print("ok  overlapped step: the optimizer call %.1f ms (in place %.1f), the next step waited "
          "%.1f ms" % (overlapped, in_place, with_file["optim_wait_ms"][0]))
    offload_out_of_room()
    master_offload()

    # pp 4 with 2 chunks per stage needs 8 units: `small` (6 blocks).
    small = ["--set", "model.name=small"]
    d1 = os.path.join(WORK, "eq_small_1")
    T.train(d1, 1, *small, steps=6)
    d4 = os.path.join(WORK, "eq_small_pp4")
    T.train(d4, 4, *small, *pp_set(4, "interleaved", "--set", "pp.virtual_stages=2"), steps=6)
    compare("small, pp=4 interleaved, 2 chunks per stage", losses(d4), losses(d1))

    # The first log lines name the stages.
    d = os.path.join(WORK, "eq_log")
    shutil.rmtree(d, ignore_errors=True)
    p = run([a for a in T.launch(2, d, *pp_set(2), steps=1) if a != "--quiet"])
    want = ("loom: pipeline 1f1b, 4 microbatches, 1 chunk(s) per stage: stage 0: embedding, "
            "blocks 0-1; stage 1: final norm and head")
    if want not in p.stdout:
        fail("the log should name the stages (%r):\n%s" % (want, p.stdout[-2000:]))
    print("ok  first log lines name the stages")
    # With the head split they name the share stage 0 runs (the planner's choice for `tiny`,
    # whose head is ~25x a block: half the rows, the blocks one per stage).
    shutil.rmtree(d, ignore_errors=True)
    p = run([a for a in T.launch(2, d, *pp_set(2, "1f1b", *HEAD_SPLIT), steps=1)
             if a != "--quiet"])
    want = ("loom: head split: stage 0 runs the head for rows [0, 32) of each microbatch's 64 "
            "(50%), the last stage the rest")
    if want not in p.stdout:
        fail("the log should name the head split (%r):\n%s" % (want, p.stdout[-2000:]))
    print("ok  the head split's share is named")


def ckpt_bytes(run_dir):
    """Every checkpoint's data files under run_dir, by relative path."""
    out = {}
    root = os.path.join(run_dir, "ckpt")
    for step in sorted(os.listdir(root)):
        for name in sorted(os.listdir(os.path.join(root, step))):
            if name.endswith(".bin"):
                with open(os.path.join(root, step, name), "rb") as f:
                    out[step + "/" + name] = f.read()
    return out


def master_offload():
    """zero.offload_master: the fp32 master weights stream with Adam's moments and the blocks'
    weight matrices leave memory; the bf16 products read copies made from the master after each
    update. The same bits as the master in memory — losses and every checkpoint byte — on one
    process, pp 2 (the step beside the next), pp 2 x dp 2 and tp 2, with this CPU's bf16
    products and with the widening path of CPUs without them (oneDNN held to AVX2); the model
    state drops by the matrices' 4 bytes per element and by wte's (the lookup reads its rows
    from the file; on the head's stage the embedding's copy); a run resumes from its own
    checkpoint bit for bit."""
    bf16 = ["--set", "train.dtype=bf16", "--set", "zero.offload=disk", "--set", "ckpt.every=10"]
    master = ["--set", "zero.offload_master=true"]
    avx2 = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2")
    for name, n, extra, env in [
            ("one process", 1, [], None), ("pp=2 1f1b", 2, pp_set(2), None),
            ("one process, products widened (AVX2)", 1, [], avx2),
            ("pp=2 x dp=2 zb-h1", 4, pp_set(2, "zb-h1"), None),
            ("tp=2 sequence parallel", 2, ["--set", "train.tp=2", "--set",
                                           "tp.sequence_parallel=true"], None)]:
        if SANITIZED and name != "pp=2 1f1b":  # the thread and the head stage: time is short
            continue
        ref, mine = (os.path.join(WORK, "eq_master_" + slug(name) + k) for k in ("_ref", ""))
        for d, more in ((ref, []), (mine, master)):
            shutil.rmtree(d, ignore_errors=True)
            run(T.launch(n, d, *bf16, *extra, *more), env=env)
        compare("master weights on disk, " + name, losses(mine), losses(ref), tol=0)
        if ckpt_bytes(mine) != ckpt_bytes(ref):
            fail("master weights on disk, %s: the checkpoints differ from the master in memory's"
                 % name)
        # tiny: 2 blocks of 12 x 64^2 matrix elements, wte's 50304 x 64 and wpe's 64 x 64,
        # 4 bytes each; the bound allows the partial pages at each tensor's two ends.
        matrices, wte, wpe = 2 * 12 * 64 * 64, 50304 * 64, 64 * 64

        def state_drop(rank, elements, tensors, what, copied=0):
            """The model state `mine` saves: the fp32 `elements` that leave memory, less, where
            the products do not read bf16 (Gemm::reads_bf16), the bf16 copies of the `copied`
            elements the products read that `mine` keeps and the master in memory does not
            (it multiplies its fp32 weights there; with bf16 products both keep them)."""
            drop = (metrics(ref)[-1]["state_peak_mb"][rank] -
                    metrics(mine)[-1]["state_peak_mb"][rank])
            kept = 0 if READS_BF16 and env is None else copied * 2
            full = (elements * 4 - kept) / 2**20
            if not full - tensors * 8 / 1024 <= drop <= full + 1e-3:
                fail("master weights on disk, %s: rank %d should free %s, %.3f MiB of model "
                     "state (%.3f MiB of bf16 copies kept); freed %.3f" %
                     (name, rank, what, full, kept / 2**20, drop))
            print("ok  master weights on disk, %s: rank %d's model state %.3f MiB lower (%s: "
                  "%.3f)" % (name, rank, drop, what, full))

        if name == "one process":
            # The lookup reads its rows from the file: wte leaves memory with the matrices (the
            # head's product reads the embedding unit's copy).
            state_drop(0, matrices + wte, 9, "the matrices and wte", matrices + wte + wpe)
            # Its own checkpoint resumes it bit for bit.
            T.resume_from(WORK, mine, "master weights on disk -> itself", 1, bf16 + master,
                          losses(mine), tol=0)
        if name == "one process, products widened (AVX2)":  # the other rule on any CPU
            state_drop(0, matrices + wte, 9, "the matrices and wte", matrices + wte + wpe)
        if name == "pp=2 1f1b":
            # The last stage (final norm and head) holds the tied embedding only for the head's
            # product: its fp32 wte and wpe leave memory too. The first stage (the embedding
            # and both blocks: the head outweighs them) looks its tokens up from the master in
            # the file: its wte leaves memory with the matrices.
            state_drop(1, wte + wpe, 2, "the head's embedding copy", wte + wpe)
            state_drop(0, matrices + wte, 9, "the matrices and wte", matrices)


def offload_out_of_room():
    """A moment file on a file system that fills up during the run (a 1 MiB tmpfs; `tiny`'s
    moments are 26 MB): the overlapped step's failed write ends the job with the file and
    the reason named; it neither hangs nor trains on."""
    if os.geteuid() != 0:
        print("skip out-of-room offload: mounting a tmpfs needs root")
        return
    full = os.path.join(WORK, "full_fs")
    os.makedirs(full, exist_ok=True)
    run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", full])
    try:
        d = os.path.join(WORK, "eq_zero_offload_full")
        shutil.rmtree(d, ignore_errors=True)
        p = run(T.launch(1, d, "--set", "zero.offload=disk", "--set", "zero.offload_dir=" + full),
                expect_rc=None)
        want = "loom: error: cannot write %s/adam-moments-rank0.bin: No space left on device" % full
        if p.returncode != 2 or want not in p.stderr:
            fail("a full moment file system should end the run (exit 2, %r); exit %d:\n%s"
                 % (want, p.returncode, p.stderr[-2000:]))
        print("ok  a moment file that runs out of room: exit 2, %r" % want)
    finally:
        run(["umount", full])


def resume_from(ref, name, n, extra, want):
    return T.resume_from(WORK, ref, name, n, extra, want)


def resume():
    one = os.path.join(WORK, "rs_one")
    T.train(one, 1, "--set", "ckpt.every=10")
    want = losses(one)
    pp2 = os.path.join(WORK, "rs_pp2")
    T.train(pp2, 2, "--set", "ckpt.every=10", *pp_set(2))
    compare("pp=2 (uninterrupted)", losses(pp2), want)
    resume_from(pp2, "pp 2 -> one process", 1, [], want)
    resume_from(pp2, "pp 2 -> pp 4 zb-h1", 4, pp_set(4, "zb-h1"), want)
    resume_from(pp2, "pp 2 -> one process, optimizer state on disk", 1,
                ["--set", "zero.offload=disk"], want)
    on_disk = os.path.join(WORK, "rs_on_disk")  # its checkpoints stream the moments out
    T.train(on_disk, 1, "--set", "ckpt.every=10", "--set", "zero.offload=disk")
    resume_from(on_disk, "optimizer state on disk -> pp 2 in memory", 2, pp_set(2), want)
    resume_from(one, "one process -> pp 2 x dp 2 zero 3", 4,
                pp_set(2, "1f1b", "--set", "train.zero=3"), want)
    # The head split resumes bit-exact from its own checkpoint, and its checkpoint is the
    # usual one (one process resumes it within the tolerance).
    split = os.path.join(WORK, "rs_head_split")
    T.train(split, 2, "--set", "ckpt.every=10", *pp_set(2, "zb-h1", *HEAD_SPLIT))
    mine = losses(split)
    T.resume_from(WORK, split, "head split -> head split", 2, pp_set(2, "zb-h1", *HEAD_SPLIT),
                  mine, tol=0)
    resume_from(split, "head split -> one process", 1, [], want)
    p = run([LOOM, "sample", "--ckpt", pp2, "--prompt", "And God said", "-n", "8",
             "--temperature", "0"])
    if not p.stdout.startswith("And God said") or len(p.stdout.strip()) <= 12:
        fail("loom sample from a pp 2 checkpoint printed %r" % p.stdout)
    print("ok  loom sample from a pipeline checkpoint: %r" % p.stdout.strip())

    # A rank killed mid-step: the job ends within the deadline, naming it.
    d = os.path.join(WORK, "rs_kill")
    shutil.rmtree(d, ignore_errors=True)
    proc = subprocess.Popen(T.launch(2, d, *pp_set(2), steps=100000), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    wait_for(lambda: os.path.exists(os.path.join(d, "metrics.jsonl")), 120, "the first step")
    took = kill_rank(proc, 1)
    print("ok  kill -9 of stage 1 mid-step: job ended in %.1f s naming it" % took)

    # Bad input: one clear error on every rank, a non-zero exit, nothing written.
    fresh = os.path.join(WORK, "rs_bad")
    shutil.rmtree(fresh, ignore_errors=True)
    cases = [
        ("more stages than units", 5, pp_set(5), "cannot cut the model's 4 units"),
        ("interleaved with fewer microbatches than stages", 2,
         pp_set(2, "interleaved", "--set", "pp.virtual_stages=2", "--set",
                "train.micro_batch=4", "--set", "train.global_batch=4"),
         "needs at least as many microbatches as stages"),
        ("a split that does not add up", 2, pp_set(2, "1f1b", "--set", "pp.split=[1, 2]"),
         "pp.split = [1, 2] does not cut the model's 4 units into 2 stages"),
        ("a cap on the interleaved schedule", 2,
         pp_set(2, "interleaved", "--set", "pp.virtual_stages=2", "--set",
                "pp.active_microbatches=2"), "does not apply to the interleaved schedule"),
        ("an unknown schedule", 2, pp_set(2, "zb-h3"), "pp.schedule = \"zb-h3\" is invalid"),
        ("the head split with tensor parallelism", 4,
         pp_set(2, "1f1b", *HEAD_SPLIT, "--set", "train.tp=2"),
         "pp.head_split is built without tensor parallelism or activation offload"),
        ("the head split without a pipeline", 2, list(HEAD_SPLIT),
         "pp.head_split need pipeline parallelism"),
        ("a spill folder that cannot be written", 2,
         pp_set(2, "1f1b", "--set", "train.offload_activations=true", "--set",
                "train.offload_dir=/proc/loom-spill"), "cannot create the activation spill file"),
        ("offload without a pipeline", 2, ["--set", "train.offload_activations=true"],
         "train.offload_activations needs pipeline parallelism"),
        ("master-weight offload without the moments on disk", 2,
         ["--set", "zero.offload_master=true", "--set", "train.dtype=bf16"],
         "zero.offload_master needs zero.offload = \"disk\", train.zero = 0, train.dtype = "
         "\"bf16\" and train.backend = \"cpu\"; this run has zero.offload = \"none\""),
        ("an optimizer-state folder that cannot be written", 2,
         ["--set", "zero.offload=disk", "--set", "zero.offload_dir=/proc/loom-offload"],
         "cannot create the optimizer-state file"),
    ]
    for name, n, extra, msg in cases:
        p = run(T.launch(n, fresh, *extra), expect_rc=None)
        if p.returncode == 0:
            fail(name + ": should fail")
        for r in range(n):
            if not re.search(r"\[rank %d\] loom: error: .*%s" % (r, re.escape(msg)), p.stderr):
                fail("%s: rank %d should print the error:\n%s" % (name, r, p.stderr[-2000:]))
        if os.path.exists(fresh):
            fail(name + ": a failed start created " + fresh)
        print("ok  bad input (%s): error on every rank, exit %d" % (name, p.returncode))


T = Trainer(LOOM, prepare_data(LOOM, WORK))
# "master": master_offload alone (by hand; the CTest entry runs it inside "equivalence").
{"equivalence": equivalence, "resume": resume, "master": master_offload}[MODE]()
print("PASS", MODE)
