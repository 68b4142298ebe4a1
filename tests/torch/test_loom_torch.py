"""loom_torch: `import loom_torch; dist.init_process_group(backend="loom")` (issue 5).

Run with /usr/bin/python3 -m pytest tests/torch (PYTHONPATH holding build/python; the
CTest entry sets it). Ranks are plain subprocesses (torchrun is not used: see README)."""
import json
import os
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from common import free_port  # noqa: E402


def launch(scenario, world, timeout=240, **extra_env):
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="loom-torch-")
    outs = [os.path.join(tmp, "rank%d.json" % r) for r in range(world)]
    env = dict(os.environ, OMP_NUM_THREADS="1", LOOM_LOG="error", **extra_env)
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "worker.py"), scenario, str(r),
                               str(world), str(port), outs[r]],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for r in range(world)]
    logs = [p.communicate(timeout=timeout)[0] for p in procs]
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
    got = launch("any_source", 3, LOOM_TORCH_ANY_SOURCE="1")[0]["got"]
    assert got[0] == [1, 10.0]
    assert sorted(got[1:]) == [[1, 11.0], [2, 20.0]], got


def test_loom_run_starts_a_torch_script():
    loom = os.environ.get("LOOM_BIN")
    if not loom:
        pytest.skip("LOOM_BIN (the loom executable) not given")
    p = subprocess.run([loom, "run", "-n", "3", sys.executable, os.path.join(HERE, "env_worker.py")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    for r in range(3):
        assert "[rank %d] rank %d of 3: sum 6" % (r, r) in p.stdout, p.stdout
