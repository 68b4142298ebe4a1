"""PyTorch's own distributed test suite against backend "loom" (issue 16).

Runs torch.testing._internal.distributed.distributed_test (shipped with Debian's
python3-torch) the way PyTorch's test/distributed/test_distributed_spawn.py does: each test
spawns WORLD_SIZE processes that join through a file store. For BACKEND=loom, the suite's
feature tables and require_backend() list "loom" wherever they list "gloo", and its gloo-only
skips (`BACKEND != "gloo"`) apply to loom as to gloo, so loom meets every test gloo meets
(tests that need CUDA still skip: this machine has none). The few it does not support are listed in UNSUPPORTED with the
reason, and skipped with that reason.

  BACKEND=loom WORLD_SIZE=2 PYTHONPATH=build/python /usr/bin/python3 tests/torch/torch_suite.py
  ... torch_suite.py -k test_broadcast        (unittest's name filter)
  BACKEND=gloo ...                             (the same tests on gloo, for comparison)
  LOOM_SUITE_JSON=out.json ...                 (every test's outcome, as JSON)
  LOOM_SUITE_ONLY=test_a,test_b ...            (with LOOM_SUITE_JSON: just these tests)
tests/torch/test_loom_torch.py runs it for loom and gloo on 2 and 3 processes and requires
loom to pass every test gloo passes.
"""
import os
import re
import sys
import time
import types
import unittest

BACKEND = os.environ.setdefault("BACKEND", "loom")
os.environ.setdefault("WORLD_SIZE", "2")
# A hang fails the test after this long instead of PyTorch's 300 s.
os.environ.setdefault("DISTRIBUTED_TESTS_DEFAULT_TIMEOUT", "120")

try:
    import expecttest  # noqa: F401  (torch's test utilities import it)
except ImportError:  # not packaged in Debian 12: a stand-in that only has to exist
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "shim"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.testing._internal import common_distributed  # noqa: E402

if BACKEND == "loom":
    import loom_torch  # noqa: F401  (registers the backend)

    for table in (common_distributed.DistTestCases.skip_collective,
                  common_distributed.DistTestCases.backend_feature):
        for feature, backends in table.items():
            if "gloo" in backends:
                backends.add("loom")

# What loom does not do, by test name (the reason is printed as the skip reason).
UNSUPPORTED = {
    # torch 1.13's dist.monitored_barrier() refuses every backend but gloo before it reaches
    # the process group; loom implements monitoredBarrier (pg.monitored_barrier() reaches it:
    # test_monitored_barrier_gloo_rank_0_timeout, and tests/torch's own scenario).
    "test_monitored_barrier_gloo": "torch 1.13 lets only gloo call dist.monitored_barrier",
    "test_monitored_barrier_gloo_subgroup": "torch 1.13 lets only gloo call dist.monitored_barrier",
    "test_monitored_barrier_wait_all_ranks":
        "torch 1.13 lets only gloo call dist.monitored_barrier",
    "test_monitored_barrier_failure_order": "torch 1.13 lets only gloo call dist.monitored_barrier",
    "test_sparse_all_reduce_sum": "loom reduces dense tensors only",
    "test_sparse_all_reduce_sum_cuda": "loom reduces dense tensors only",
}

NAME = "torch.testing._internal.distributed.distributed_test"


def load_suite():
    """The suite's module, its gloo-only conditions extended to loom."""
    import importlib.util
    path = importlib.util.find_spec(NAME).origin
    src = open(path).read()
    if BACKEND == "loom":
        src, n1 = re.subn(r'BACKEND != "gloo"', 'BACKEND not in ("gloo", "loom")', src)
        src, n2 = re.subn(r'BACKEND == "gloo"', 'BACKEND in ("gloo", "loom")', src)
        # require_backend({"gloo", ...}): loom too.
        src, n3 = re.subn(r'    if BACKEND not in backends:\n',
                          '    if BACKEND not in backends and not (BACKEND == "loom" and '
                          '"gloo" in backends):\n', src, count=1)
        assert n1 + n2 >= 15 and n3 == 1, "distributed_test.py changed: %d gloo conditions, %d " \
            "require_backend" % (n1 + n2, n3)
    mod = types.ModuleType(NAME)
    mod.__file__ = path
    sys.modules[NAME] = mod
    exec(compile(src, path, "exec"), mod.__dict__)
    return mod


suite = load_suite()


class _ShortPolls:
    """`time` for the harness's polling loops: the suite's file barrier (twice per test) and
    the parent's wait for its ranks sleep 0.1 s between looks, ~0.15 s of every test's ~0.6 s
    here; 5 ms looks instead (both backends: the comparison stays fair). The tests' own
    sleeps keep the real `time`."""

    def __getattr__(self, name):
        return getattr(time, name)

    @staticmethod
    def sleep(seconds):
        time.sleep(min(seconds, 0.005))


common_distributed.time = _ShortPolls()
_barrier_sync = suite.Barrier.sync.__func__


def _barrier_with_short_polls(cls, *args, **kwargs):
    suite.time = common_distributed.time  # a test body never runs during the barrier
    try:
        return _barrier_sync(cls, *args, **kwargs)
    finally:
        suite.time = time


suite.Barrier.sync = classmethod(_barrier_with_short_polls)

# The suite's processes run DDP with ReplicatedTensor on, which imports
# torch.distributed._shard: Debian's torch 1.13 cannot import that on Python 3.11 (a
# dataclass with a mutable default), for gloo as for loom. DDP's default mode stays on.
from torch.nn.parallel import _replicated_tensor_ddp_utils  # noqa: E402

_replicated_tensor_ddp_utils._set_ddp_with_replicated_tensor = lambda value: None


class TestDistBackendWithFork(suite.TestDistBackend, suite.DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        # Forked, not spawned as upstream does: the ranks start with torch already imported
        # (~2 s saved per test and rank on this machine).
        self._start_processes(torch.multiprocessing.get_context("fork").Process)
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


for _name, _why in UNSUPPORTED.items() if BACKEND == "loom" else ():
    if hasattr(TestDistBackendWithFork, _name):
        setattr(TestDistBackendWithFork, _name,
                unittest.skip("[loom] " + _why)(getattr(TestDistBackendWithFork, _name)))


def run_to_json(path):
    """Runs every test; writes {test name: "passed" | "failed" | "skipped: why"} to path."""
    import json
    tests = unittest.TestLoader().loadTestsFromTestCase(TestDistBackendWithFork)
    only = [t for t in os.environ.get("LOOM_SUITE_ONLY", "").split(",") if t]
    if only:  # just these tests (by name)
        tests = unittest.TestSuite(t for t in tests if t.id().rsplit(".", 1)[-1] in only)
    name = lambda t: t.id().rsplit(".", 1)[-1]  # noqa: E731
    out = {name(t): "passed" for t in tests}  # (the suite drops each test once it ran)
    result = unittest.TextTestRunner(stream=sys.stderr, verbosity=1).run(tests)
    for t, _ in result.failures + result.errors:
        out[name(t)] = "failed"
    for t, why in result.skipped:
        out[name(t)] = "skipped: " + why
    with open(path, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    assert dist.is_available()
    if os.environ.get("LOOM_SUITE_JSON"):
        run_to_json(os.environ["LOOM_SUITE_JSON"])
    else:
        unittest.main(argv=sys.argv, verbosity=2)
