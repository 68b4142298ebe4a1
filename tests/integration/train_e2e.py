#!/usr/bin/python3
"""`loom train` / `loom sample` end to end, on the King James Bible (Debian bible-kjv).

  train_e2e.py LOOM WORKDIR resume   kill -9 mid-run, --resume, losses bit-identical to an
                                     uninterrupted run; TensorBoard file decoded and equal to
                                     metrics.jsonl; bad inputs fail with one clear line and
                                     change nothing; SIGINT saves and exits 130; sampling is
                                     deterministic in its seed
  train_e2e.py LOOM WORKDIR bf16     200 steps of tiny: bf16 loss within 2% of fp32's
  train_e2e.py LOOM WORKDIR backend  train.backend = reference (plain-loop kernels) against the
                                     default cpu backend: every step's loss and gradient norm
                                     within 1e-5
  train_e2e.py LOOM WORKDIR nonfinite  a NaN in one gradient element of one rank of a tp 2 x
                                     dp 2 job (LOOM_TEST_POISON_GRAD): train.on_nonfinite stop,
                                     skip and rewind against clean runs built from the same
                                     checkpoint, bit for bit; ckpt.keep = 1 keeps the finite one
"""
import hashlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time

from common import fail, metrics, prepare_data, run  # noqa: E402

LOOM, WORK, MODE = sys.argv[1], sys.argv[2], sys.argv[3]


def train_cmd(run_dir, *extra):
    return [LOOM, "train", "-c", os.path.join(os.path.dirname(__file__), "../../configs/tiny.toml"),
            "--set", "data.path=" + DATA, "--set", "run.dir=" + run_dir, "--set", "train.steps=40",
            "--set", "train.micro_batch=8", "--set", "train.global_batch=8",
            "--set", "ckpt.every=10", "--set", "eval.every=20", "--set", "train.threads=2",
            "--set", "optim.warmup_steps=5", "--quiet", *extra]


def losses(run_dir):
    # json floats are shortest round-trip: equal text <=> equal float bits
    return {(m["step"], k): repr(m[k]) for m in metrics(run_dir) for k in ("loss", "val_loss") if k in m}


def wait_for(path, proc, timeout=120):
    deadline = time.time() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None:
            fail(f"the run ended (rc {proc.returncode}) before {path} appeared")
        if time.time() > deadline:
            fail(f"{path} did not appear")
        time.sleep(0.005)


# --- TensorBoard: an independent decoder of TFRecord + the Event protobuf ---------------
def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(c):
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def fields(buf):
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(buf, i)
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        elif wt == 2:
            n, i = varint(buf, i)
            v, i = buf[i:i + n], i + n
        else:
            fail(f"unexpected wire type {wt}")
        yield num, v


def varint(buf, i):
    shift = v = 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return v, i


def read_events(path):
    data = open(path, "rb").read()
    i, scalars, version = 0, {}, None
    while i < len(data):
        (n,) = struct.unpack_from("<Q", data, i)
        if struct.unpack_from("<I", data, i + 8)[0] != masked(crc32c(data[i:i + 8])):
            fail("length crc mismatch")
        ev = data[i + 12:i + 12 + n]
        if struct.unpack_from("<I", data, i + 12 + n)[0] != masked(crc32c(ev)):
            fail("data crc mismatch")
        i += 12 + n + 4
        step = 0
        for num, v in fields(ev):
            if num == 2:
                step = v
            elif num == 3:
                version = v.decode()
            elif num == 5:
                for _, value in fields(v):
                    tag, simple = None, None
                    for vn, vv in fields(value):
                        if vn == 1:
                            tag = vv.decode()
                        elif vn == 2:
                            simple = struct.unpack("<f", vv)[0]
                    scalars[(tag, step)] = simple
    if version != "brain.Event:2":
        fail(f"file_version {version!r}")
    return scalars


def check_resume():
    a, b, c = (os.path.join(WORK, x) for x in ("run_a", "run_b", "run_c"))
    run(train_cmd(a))
    # B: killed with -9 right after its step-10 checkpoint, then resumed.
    p = subprocess.Popen(train_cmd(b), stdout=subprocess.DEVNULL)
    wait_for(os.path.join(b, "ckpt/step_00000010/manifest.json"), p)
    p.kill()
    p.wait()
    done = len([m for m in metrics(b) if "loss" in m])
    if done >= 40:
        fail("the killed run had already finished; the test proves nothing")
    run(train_cmd(b, "--resume"))
    la, lb = losses(a), losses(b)
    if len(la) != 42 or la != lb:
        diff = [k for k in sorted(la) if la.get(k) != lb.get(k)][:5]
        fail(f"resumed run differs (killed after {done} steps): first differences {diff}")
    print(f"resume: killed after {done} steps, resumed, 40 losses + 2 val losses bit-identical")

    # TensorBoard scalars equal metrics.jsonl (as float32).
    ev = [f for f in os.listdir(a) if f.startswith("events.out.tfevents.")]
    if len(ev) != 1:
        fail(f"expected one event file in {a}, found {ev}")
    sc = read_events(os.path.join(a, ev[0]))
    for m in metrics(a):
        key, tag = ("loss", "train/loss") if "loss" in m else ("val_loss", "val/loss")
        got = sc.get((tag, m["step"]))
        if got is None or struct.pack("<f", got) != struct.pack("<f", m[key]):
            fail(f"TensorBoard {tag} at step {m['step']}: {got} vs {m[key]}")
    for tag in ("train/lr", "train/grad_norm", "perf/tokens_per_s", "perf/mfu", "perf/step_ms"):
        if (tag, 40) not in sc:
            fail(f"TensorBoard lacks {tag}")
    print(f"tensorboard: {len(sc)} scalars decoded, CRCs valid, equal to metrics.jsonl")

    # Bad input: one line + hint, exit 2, nothing changed.
    before = hashlib.sha256(open(os.path.join(a, "metrics.jsonl"), "rb").read()).hexdigest()
    ckpts = sorted(os.listdir(os.path.join(a, "ckpt")))
    for cmd, want in [
        (train_cmd(a), "already holds a run"),
        (train_cmd(a, "--resume", "--set", "model.name=small"), "is of model"),
        (train_cmd(os.path.join(WORK, "run_x"), "--set", "data.path=" + WORK + "/nope"), "is not a folder"),
        (train_cmd(os.path.join(WORK, "run_x"), "--set", "train.stpes=3"), "did you mean 'train.steps'"),
        (train_cmd(os.path.join(WORK, "run_x"), "--set", "train.seq_len=65"), "exceeds the context"),
        (train_cmd(os.path.join(WORK, "run_x"), "--set", "train.global_batch=12"), "not a multiple"),
    ]:
        p = run(cmd, expect_rc=2)
        lines = p.stderr.strip().splitlines()
        if len(lines) != 2 or want not in p.stderr or not lines[1].startswith("hint: "):
            fail(f"expected one error line with '{want}' and a hint, got:\n{p.stderr}")
    after = hashlib.sha256(open(os.path.join(a, "metrics.jsonl"), "rb").read()).hexdigest()
    if before != after or sorted(os.listdir(os.path.join(a, "ckpt"))) != ckpts:
        fail("a failed command changed the run directory")
    print("bad input: 6 cases, one line + hint each, exit 2, run directory untouched")

    # SIGINT: stop at the step boundary, save, exit 130; --resume continues.
    p = subprocess.Popen(train_cmd(c), stdout=subprocess.DEVNULL)
    wait_for(os.path.join(c, "ckpt/step_00000010/manifest.json"), p)
    p.send_signal(signal.SIGINT)
    if p.wait(timeout=60) != 130:
        fail(f"SIGINT: exit {p.returncode}, expected 130")
    stopped = max(m["step"] for m in metrics(c))
    if not os.path.exists(os.path.join(c, "ckpt/step_%08d/manifest.json" % stopped)):
        fail(f"SIGINT at step {stopped} left no checkpoint of that step")
    run(train_cmd(c, "--resume"))
    if losses(c) != la:
        fail("the run interrupted by SIGINT and resumed differs from the uninterrupted one")
    print(f"SIGINT: stopped after step {stopped} with a checkpoint, exit 130, resumed identically")

    # Sampling: deterministic in its seed, continues the prompt.
    s1 = run([LOOM, "sample", "--ckpt", a, "--prompt", "In the beginning", "-n", "30", "--seed", "7"]).stdout
    s2 = run([LOOM, "sample", "--ckpt", a, "--prompt", "In the beginning", "-n", "30", "--seed", "7"]).stdout
    if s1 != s2 or not s1.startswith("In the beginning") or len(s1) < len("In the beginning") + 20:
        fail(f"sample output not deterministic or too short: {s1!r} vs {s2!r}")
    print("sample:", s1.strip().replace("\n", " ")[:120])
    # A batch of prompts: each continues its own prompt, the greedy text of each equals its
    # text alone, and greedy decoding with the cache equals the full-window reference.
    greedy = [LOOM, "sample", "--ckpt", a, "-n", "20", "--temperature", "0"]
    prompts = ["And God said", "Jesus wept"]
    both = run(greedy + ["--prompt", prompts[0], "--prompt", prompts[1]]).stdout.split("----\n")
    for text, prompt in zip(both, prompts):
        alone = run(greedy + ["--prompt", prompt]).stdout
        reference = run(greedy + ["--prompt", prompt, "--no-cache"]).stdout
        if not (text == alone == reference and text.startswith(prompt)):
            fail(f"batch / alone / no-cache sample differ for {prompt!r}: {text!r} {alone!r} "
                 f"{reference!r}")
    print("sample: a batch of 2 prompts equals each alone and the no-cache reference")
    # Threads follow the CPUs the process may use (taskset here; a cpuset in a container).
    cmd = train_cmd(os.path.join(WORK, "run_taskset"), "--set", "train.steps=1",
                    "--set", "train.threads=0")
    out = run(["taskset", "-c", "0"] + [x for x in cmd if x != "--quiet"]).stdout
    if "threads per rank: 1 (1 CPUs this process may use / 1 rank(s)" not in out:
        fail("under taskset -c 0 the first log line should say 1 thread of 1 CPU:\n" + out[:600])
    print("threads: 1 under taskset -c 0, stated in the first log line")
    p = run([LOOM, "sample", "--ckpt", a, "--top-p", "0"], expect_rc=2)
    if "--top-p" not in p.stdout + p.stderr or "hint:" not in p.stdout + p.stderr:
        fail("--top-p 0 should fail with a one-line error and a hint: " + p.stdout + p.stderr)


def check_bf16():
    def final(dtype):
        d = os.path.join(WORK, "run_" + dtype)
        run(train_cmd(d, "--set", "train.steps=200", "--set", "train.dtype=" + dtype,
                      "--set", "eval.every=0", "--set", "ckpt.every=0"))
        ls = [m["loss"] for m in metrics(d) if "loss" in m]
        return sum(ls[-20:]) / 20, ls[0]
    f32, f32_first = final("fp32")
    b16, _ = final("bf16")
    # An ignored train.dtype = bf16 would give fp32's very losses: bf16 must differ.
    per_step = [[m["loss"] for m in metrics(os.path.join(WORK, "run_" + d)) if "loss" in m]
                for d in ("fp32", "bf16")]
    if per_step[0] == per_step[1]:
        fail("train.dtype = bf16 gave fp32's losses bit for bit: bf16 was not used")
    rel = abs(b16 - f32) / f32
    print(f"bf16: mean loss of steps 181-200 {b16:.4f} vs fp32 {f32:.4f} (from {f32_first:.3f}): {100 * rel:.2f}%")
    if not f32 < 0.8 * f32_first:
        fail("fp32 did not learn")
    if rel > 0.02:
        fail("bf16 is more than 2% away from fp32")


def check_backend():
    def step_losses(backend):
        d = os.path.join(WORK, "run_" + backend)
        run(train_cmd(d, "--set", "train.steps=5", "--set", "train.dtype=fp32",
                      "--set", "train.micro_batch=2", "--set", "train.global_batch=2",
                      "--set", "eval.every=0", "--set", "ckpt.every=0",
                      "--set", "train.backend=" + backend))
        return [(m["loss"], m["grad_norm"]) for m in metrics(d) if "loss" in m]
    fast, ref = step_losses("cpu"), step_losses("reference")
    if len(fast) != 5 or len(ref) != 5:
        fail(f"expected 5 steps from each run, got {len(fast)} and {len(ref)}")
    # The loss alone is a weak witness this early (near ln V, its float rounding hides
    # differences of 1e-7); the gradient norm is not.
    for i, what in ((0, "loss"), (1, "gradient norm")):
        worst = max(abs(f[i] - r[i]) / r[i] for f, r in zip(fast, ref))
        print(f"reference vs cpu backend, 5 steps of tiny in fp32: worst relative {what} "
              f"difference {worst:.2e}")
        if worst > 1e-5:
            fail(f"the backends' {what} differ by {worst:.2e} (cpu {fast}, reference {ref})")
    if fast[-1][0] >= fast[0][0]:
        fail("the loss did not fall in 5 steps")
    p = run(train_cmd(os.path.join(WORK, "run_bad"), "--set", "train.backend=cuda"), expect_rc=2)
    out = p.stdout + p.stderr
    if "train.backend" not in out or "hint:" not in out or "reference" not in out:
        fail("an unknown backend should fail with one line naming the choices: " + out)


# --- non-finite steps (issue 38) ----------------------------------------------------------
NF_POISON = "5:1"  # step 5 (1-based), rank 1: tensor-parallel rank 1 of replica 0


def nf_cmd(run_dir, steps, *extra):
    return [LOOM, "run", "-n", "4", LOOM, "train", "-c",
            os.path.join(os.path.dirname(__file__), "../../configs/tiny.toml"),
            "--set", "data.path=" + DATA, "--set", "run.dir=" + run_dir,
            "--set", f"train.steps={steps}", "--set", "train.tp=2", "--set", "train.micro_batch=2",
            "--set", "train.global_batch=4", "--set", "train.seq_len=32", "--set", "train.threads=1",
            "--set", "optim.warmup_steps=2", "--set", "ckpt.every=2", "--set", "eval.every=0",
            "--quiet", *extra]


def nf_run(run_dir, steps, *extra, poison=True, rc=0):
    env = dict(os.environ)
    env.pop("LOOM_TEST_POISON_GRAD", None)
    if poison:
        env["LOOM_TEST_POISON_GRAD"] = NF_POISON
    return run(nf_cmd(run_dir, steps, *extra), expect_rc=rc, env=env)


def step_values(run_dir, key="loss"):
    """{step: repr(value)} of the last line of each step (a rewound step is logged again)."""
    return {m["step"]: repr(m.get(key)) for m in metrics(run_dir)}


def resumed_from(src_ckpt, run_dir, next_step, data_offset=None):
    """A run dir whose only checkpoint is src_ckpt saved as next_step (data moved by
    data_offset samples): the state a skipped or rewound run should continue from."""
    dst = os.path.join(run_dir, "ckpt", "step_%08d" % next_step)
    shutil.copytree(src_ckpt, dst)
    path = os.path.join(dst, "manifest.json")
    with open(path) as f:
        man = json.load(f)
    man["step"] = next_step
    man["meta"]["next_step"] = next_step
    if data_offset is not None:
        man["meta"]["data_offset"] = data_offset
    with open(path, "w") as f:
        json.dump(man, f)


def same(what, got, want, steps):
    bad = [s for s in steps if got.get(s) != want.get(s)]
    if bad:
        fail(f"{what}: steps {bad} differ: got {[got.get(s) for s in bad]}, "
             f"want {[want.get(s) for s in bad]}")
    print(f"{what}: steps {steps[0]}-{steps[-1]} bit-identical")


def check_nonfinite():
    clean = os.path.join(WORK, "run_clean")
    nf_run(clean, 8, poison=False)
    want = step_values(clean)
    ckpt4 = os.path.join(clean, "ckpt", "step_00000004")

    # stop: every rank stops after step 5 with the one line; no checkpoint after step 4;
    # resuming from step 4 (unpoisoned) gives the clean losses.
    stop = os.path.join(WORK, "run_stop")
    p = nf_run(stop, 8, rc=4)
    err = p.stderr
    lines = [l for l in err.splitlines() if "training diverged at step 5" in l]
    if len(lines) != 4:
        fail(f"expected the divergence line from each of the 4 ranks, got {len(lines)}:\n{err}")
    for need in ("the gradients went non-finite", "tensor wte", "on rank 1",
                 "the last good checkpoint is " + os.path.join(stop, "ckpt", "step_00000004")):
        if need not in lines[0]:
            fail(f"the stop line does not say '{need}': {lines[0]}")
    if "hint:" not in err:
        fail("the stop message has no hint: " + err)
    print("stop:", lines[0].split("loom: error: ")[-1][:200])
    ckpts = sorted(os.listdir(os.path.join(stop, "ckpt")))
    if ckpts != ["step_00000002", "step_00000004"]:
        fail(f"stop wrote or rotated checkpoints after the non-finite step: {ckpts}")
    if step_values(stop, "grad_norm").get(5) != "None":
        fail("step 5's gradient norm should be logged as null (NaN)")
    nf_run(stop, 8, "--resume", poison=False)
    same("stop, then --resume from step 4", step_values(stop), want, list(range(5, 9)))

    # skip: step 5's update is skipped; from there the losses of a run that resumed from the
    # step-4 weights and moments as step 5 (the step counter, schedule and data moved on).
    skip = os.path.join(WORK, "run_skip")
    nf_run(skip, 8, "--set", "train.on_nonfinite=skip")
    ref = os.path.join(WORK, "run_skip_ref")
    resumed_from(ckpt4, ref, 5)
    nf_run(ref, 8, "--resume", poison=False)
    got = step_values(skip)
    same("skip vs the clean run", got, want, list(range(1, 6)))
    same("skip vs a run that skipped step 5's update", got, step_values(ref), [6, 7, 8])
    skipped = [m.get("skipped_steps") for m in metrics(skip)]
    if skipped != [0, 0, 0, 0, 1, 1, 1, 1]:
        fail(f"skipped_steps per step: {skipped}")

    # rewind: back to step 4's checkpoint, the data moved past steps 5 (the failed one) and 6;
    # from there the losses of a clean run resumed from that checkpoint with the data moved.
    rew = os.path.join(WORK, "run_rewind")
    p = nf_run(rew, 8, "--set", "train.on_nonfinite=rewind")
    ref = os.path.join(WORK, "run_rewind_ref")
    resumed_from(ckpt4, ref, 4, data_offset=2 * 4)
    nf_run(ref, 8, "--resume", poison=False)
    same("rewind vs a clean run from step 4 with the data moved 8 samples", step_values(rew),
         step_values(ref), list(range(5, 9)))
    if [m["step"] for m in metrics(rew)] != [1, 2, 3, 4, 5, 5, 6, 7, 8]:
        fail(f"rewind's metrics steps: {[m['step'] for m in metrics(rew)]}")
    if metrics(rew)[-1].get("rewinds") != 1:
        fail("rewinds should count 1")

    # ckpt.keep = 1: the finite step-4 checkpoint outlives the non-finite step 5's.
    keep = os.path.join(WORK, "run_keep")
    nf_run(keep, 5, "--set", "train.on_nonfinite=skip", "--set", "ckpt.every=1",
           "--set", "ckpt.keep=1")
    ckpts = sorted(os.listdir(os.path.join(keep, "ckpt")))
    if ckpts != ["step_00000004", "step_00000005"]:
        fail(f"ckpt.keep = 1 after a non-finite step 5 left {ckpts}")
    with open(os.path.join(keep, "ckpt", "step_00000005", "manifest.json")) as f:
        if json.load(f)["meta"].get("finite") is not False:
            fail("step 5's checkpoint should be marked finite: false")
    print("ckpt.keep = 1: kept", ckpts)

    p = run(nf_cmd(os.path.join(WORK, "run_bad"), 2, "--set", "train.on_nonfinite=retry"),
            expect_rc=2)
    if "train.on_nonfinite" not in p.stderr or "hint:" not in p.stderr:
        fail("a bad train.on_nonfinite should fail naming the key: " + p.stderr)


DATA = prepare_data(LOOM, WORK)
for old in os.listdir(WORK):  # runs of an earlier invocation
    if old.startswith("run_"):
        shutil.rmtree(os.path.join(WORK, old))
{"resume": check_resume, "bf16": check_bf16, "backend": check_backend,
 "nonfinite": check_nonfinite}[MODE]()
print("OK")
