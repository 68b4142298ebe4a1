"""loom_torch: `import loom_torch; dist.init_process_group(backend="loom")` (issue 5).

Run with /usr/bin/python3 -m pytest tests/torch (PYTHONPATH holding build/python; the
CTest entry sets it). Ranks are plain subprocesses (torchrun is not used: see README)."""
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from common import alive, children, free_port  # noqa: E402


def launch(scenario, world, timeout=240, **extra_env):
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="loom-torch-")
    outs = [os.path.join(tmp, "rank%d.json" % r) for r in range(world)]
    env = dict(os.environ, OMP_NUM_THREADS="1", LOOM_LOG="error", **extra_env)
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "worker.py"), scenario, str(r),
                               str(world), str(port), outs[r]],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for r in range(world)]
    try:
        logs = [p.communicate(timeout=timeout)[0] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        logs = [p.communicate()[0] for p in procs]
        raise AssertionError("%s: a rank still ran after %d s (a hang):\n%s" % (
            scenario, timeout, "\n".join("rank %d: %s" % (r, l[-1500:])
                                           for r, l in enumerate(logs))))
    for r, p in enumerate(procs):
        assert p.returncode == 0, "rank %d exited %d:\n%s" % (r, p.returncode, logs[r][-3000:])
    return [json.load(open(o)) for o in outs]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_op_matches_gloo(world):
    res = launch("ops", world)
    assert all(r["cases"] >= 60 for r in res)
    for r in res:
        assert any("dtype Bool is not supported" in m for m in r["refusals"]), r["refusals"]
        assert any("reduce op" in m and "not supported" in m for m in r["refusals"]), r["refusals"]


def test_every_op_from_shared_memory():
    """The same cases with every tensor's storage in loom's shared memory
    (LOOM_TORCH_SHARED_MEMORY=1 at import, from 1 byte on) and every allreduce asked to run
    as the fused shared algorithm: results equal gloo's, and the fused path really ran (from
    the heap it never does: test_every_op_matches_gloo's runs report 0)."""
    res = launch("ops", 3, LOOM_TORCH_SHARED_MEMORY="1", LOOM_TORCH_SHARED_MIN="1",
                 LOOM_ALGO="shared")  # 3 ranks: rank 2 reduces in place through scratch
    for r in res:
        assert r["cases"] >= 60
        assert r["shared_memory"]["enabled"] and r["shared_memory"]["made"] > 0, r
        assert r["shared_memory"]["reused"] > 0, r  # freed storage is handed out again
        assert r["fused_allreduces"] > 0, r
    heap = launch("ops", 2, LOOM_ALGO="shared")
    assert all(r["fused_allreduces"] == 0 and not r["shared_memory"]["enabled"] for r in heap)


@pytest.mark.parametrize("world", [2, 3])
def test_shared_tensors_below_a_mebibyte_run_fused(world):
    """With use_shared_memory() on every rank, the group learns at creation that tensors from
    64 KiB on are shared: the fused allreduce runs at 64 and 256 KiB (below its 1 MiB minimum
    for heap buffers), not at 4 KiB (heap storage) nor on a 256 KiB tensor allocated before
    the allocator was on (the ranks name their buffers and all take ring). With one rank
    left on the heap the group agrees on the heap: nothing fused, the same sums, no hang."""
    for r in launch("shared_from", world):
        f = r["fused"]
        assert f["64K"] == 1 and f["256K"] == 1, f
        assert f["4K"] == 0 and f["early"] == 0, f
        if "sub 64K" in f:
            assert f["sub 64K"] == 1, f
    for r in launch("shared_from", world, LOOM_TORCH_SHARED_ONLY="1"):
        assert all(v == 0 for v in r["fused"].values()), r["fused"]


ALLOCATOR = """
import os, resource, torch, loom_torch
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
loom_torch.use_shared_memory(min_bytes=1 << 16)
assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard  # a memfd per buffer
a, small = torch.ones(1 << 16), torch.ones(8)
assert loom_torch.is_shared(a) and not loom_torch.is_shared(small)
p = a.data_ptr()
del a
b = torch.zeros(1 << 16)  # the same size class: the freed buffer again, zeroed by torch
assert b.data_ptr() == p and loom_torch.is_shared(b) and float(b.sum()) == 0
del b
pid = os.fork()
if pid == 0:  # the cached buffer is the parent's pages: a child must not hand it out
    c = torch.full((1 << 16,), 7.0)
    os._exit(0 if not loom_torch.is_shared(c) and c.data_ptr() != p else 1)
assert os.waitpid(pid, 0)[1] == 0
d = torch.full((1 << 16,), 3.0)
assert d.data_ptr() == p and float(d.sum()) == 3.0 * (1 << 16)
loom_torch.use_shared_memory(False)
assert not loom_torch.is_shared(torch.ones(1 << 16))
s = loom_torch.shared_memory_stats()
assert s["made"] == 1 and s["reused"] == 2 and s["live_bytes"] == 1 << 18, s
print("ok")
"""


def test_shared_memory_allocator_reuses_and_forks():
    """The allocator alone: storage from min_bytes on is shared, freed storage is handed out
    again, a fork()ed child allocates from torch's own allocator, off means off; the soft
    limit on open files goes up to the hard one."""
    out = subprocess.run([sys.executable, "-c", ALLOCATOR], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_ddp_matches_gloo_bit_for_bit():
    loom = launch("ddp_loom", 2)
    gloo = launch("ddp_gloo", 2)
    for r in range(2):
        assert loom[r]["losses"] == gloo[r]["losses"]
        assert loom[r]["params"] == gloo[r]["params"]
    assert loom[0]["params"] == loom[1]["params"]


def test_zero_redundancy_optimizer():
    for r in launch("zero", 2):
        assert r["max_diff"] < 1e-5, r


def test_missing_peer_raises_within_the_timeout():
    res = launch("missing_peer", 2)
    r = res[0]
    assert r["raised"], r
    assert r["after_s"] < 3 + 5, r  # the group's timeout is 3 s
    assert "loom" in r["msg"], r


def test_mismatched_collective_raises_on_every_rank():
    for r in launch("desync", 2):
        assert r["raised"], r
        assert "desync" in r["msg"], r["msg"]


def test_recv_from_any_source():
    got = launch("any_source", 3)[0]["got"]
    assert got[0] == [1, 10.0]
    assert sorted(got[1:]) == [[1, 11.0], [2, 20.0]], got


def test_destroying_the_group_while_a_send_runs_does_not_deadlock():
    r = launch("destroy_pending_send", 2, timeout=30)
    assert r[1]["got"] == [7.0, 7.0], r
    assert r[0]["destroy_s"] >= 0.5, r  # it did wait for the send (rank 1 receives after 1 s)


def test_monitored_barrier_names_the_missing_rank():
    res = launch("monitored_barrier", 3)
    assert "Rank 1 failed to pass monitoredBarrier" in res[0]["msg"], res[0]
    assert "Rank 2 successfully reached monitoredBarrier" in res[2]["msg"], res[2]


@pytest.mark.parametrize("world", [2, 3])
def test_batch_isend_irecv_and_byte_dtypes(world):
    for r in launch("p2p_and_bytes", world):
        assert r["checks"] == 4 + 3, r


def test_loom_run_starts_a_torch_script():
    loom = os.environ.get("LOOM_BIN")
    if not loom:
        pytest.skip("LOOM_BIN (the loom executable) not given")
    p = subprocess.run([loom, "run", "-n", "3", sys.executable, os.path.join(HERE, "env_worker.py")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    for r in range(3):
        assert "[rank %d] rank %d of 3: sum 6" % (r, r) in p.stdout, p.stdout


def test_ranks_die_with_their_launcher():
    """kill -9 of `loom run` (it hosts the store): torch ranks die with it at once, as loom's
    own do (PR_SET_PDEATHSIG via loom_comm's follow_launcher; the fault campaign found
    ranks training on, orphaned)."""
    loom = os.environ.get("LOOM_BIN")
    if not loom:
        pytest.skip("LOOM_BIN (the loom executable) not given")
    p = subprocess.Popen([loom, "run", "-n", "2", sys.executable,
                          os.path.join(HERE, "env_worker.py")], stdout=subprocess.PIPE,
                         text=True, env=dict(os.environ, LOOM_TEST_LINGER="1"))
    seen = 0
    while seen < 2:
        line = p.stdout.readline()
        assert line, "the ranks did not start"
        seen += "sum 3" in line
    ranks = children(p.pid)
    assert len(ranks) == 2, ranks
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    end = time.time() + 3
    while time.time() < end and any(alive(r) for r in ranks):
        time.sleep(0.05)
    left = [r for r in ranks if alive(r)]
    for r in left:
        os.kill(r, signal.SIGKILL)
    assert not left, "ranks %s outlived their launcher by 3 s" % left


GLOO_PASSED = os.path.join(HERE, "gloo_passed.json")

# Tests of PyTorch's suite that may fail once on loom, each with what is known of why; such
# a test is run a second time, and must pass then. Nothing else is run twice.
# (test_send_recv_with_tag was one until 2026-12-07: its rare failure, and a rare hang of
# test_send_recv_any_source, was destroying the group while holding the GIL the group's
# worker thread needed: test_destroying_the_group_while_a_send_runs_does_not_deadlock.)
KNOWN_FLAKES = {}


def suite_key(world):
    """What gloo's list of passes depends on: the torch version, the world size and the suite
    driver (torch_suite.py: which tests it runs and how)."""
    import torch

    with open(os.path.join(HERE, "torch_suite.py"), "rb") as f:
        driver = hashlib.sha256(f.read()).hexdigest()
    return {"torch": torch.__version__, "world": world, "driver_sha256": driver}


def gloo_reference(world, suite):
    """What gloo passes of the suite on `world` processes: the list kept in gloo_passed.json
    when it was recorded under the same key (suite_key: torch version, world, driver) — the
    same tests pass on gloo every time, so running them again only costs ~2 minutes of CI —
    else gloo run now. LOOM_TORCH_GLOO_LIVE=1 always runs gloo, and writes the list again."""
    live = os.environ.get("LOOM_TORCH_GLOO_LIVE") == "1"
    key = suite_key(world)
    if not live and os.path.exists(GLOO_PASSED):
        kept = json.load(open(GLOO_PASSED))
        if all(kept.get(k) == v for k, v in key.items()):
            return {t: "passed" for t in kept["passed"]}
        print("gloo_passed.json was recorded for %s, this run is %s: running gloo now" %
              ({k: kept.get(k) for k in key}, key))
    gloo, _ = suite("gloo", "gloo")
    if live:
        with open(GLOO_PASSED, "w") as f:
            json.dump(dict(key, passed=sorted(t for t, o in gloo.items() if o == "passed")), f,
                      indent=0)
            f.write("\n")
    return gloo


@pytest.mark.parametrize("world", [3])
def test_pytorchs_own_distributed_suite(world, tmp_path):
    """torch.testing._internal.distributed.distributed_test on loom and on gloo (issue 16):
    loom passes every test gloo passes, and fails none. 3 processes run every test 2 do, and
    those that need 3 (~1 minute for loom; world 2 is the same command). gloo's list of
    passes is kept (gloo_reference)."""
    def suite(backend, name, *only):
        out = tmp_path / ("%s.json" % name)
        env = dict(os.environ, BACKEND=backend, WORLD_SIZE=str(world), LOOM_SUITE_JSON=str(out),
                   OMP_NUM_THREADS="1", LOOM_LOG="error", TMPDIR=str(tmp_path))
        if only:
            env["LOOM_SUITE_ONLY"] = ",".join(only)
        p = subprocess.run([sys.executable, os.path.join(HERE, "torch_suite.py")], env=env,
                           cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=900)
        assert out.exists(), p.stdout[-5000:]
        return json.load(open(out)), p.stdout

    gloo = gloo_reference(world, suite)
    loom, log = suite("loom", "loom")
    first = sorted(t for t, o in loom.items() if o == "failed")
    if first:
        print("loom failed %s on the first run; its log:\n%s" % (first, log[-20000:]))
    # Only a known flake (KNOWN_FLAKES, with what is known of its cause) gets a second run;
    # any other failure fails below, and a known flake that fails twice does too.
    flakes = [t for t in first if t in KNOWN_FLAKES]
    if flakes:
        again, _ = suite("loom", "loom-again", *flakes)
        for t in flakes:
            loom[t] = again.get(t, "failed")
            print("KNOWN FLAKE %s (%s): %s when run again" % (t, KNOWN_FLAKES[t], loom[t]))
    passed = lambda r: sorted(t for t, o in r.items() if o == "passed")  # noqa: E731
    failed = sorted(t for t, o in loom.items() if o == "failed")
    missing = sorted(t for t in passed(gloo) if loom.get(t) != "passed")
    print("world %d: gloo passed %d, loom passed %d of %d tests; loom failed %s; gloo passed "
          "but loom did not: %s" % (world, len(passed(gloo)), len(passed(loom)), len(loom),
                                    failed, missing))
    assert not failed, failed
    # Only the documented exceptions (torch_suite.UNSUPPORTED, skipped with "[loom] why") may
    # pass on gloo alone.
    assert not [t for t in missing if not loom[t].startswith("skipped: [loom] ")], missing
    assert len(passed(loom)) >= 80, len(passed(loom))
