"""One rank of a loom_torch test (started by test_loom_torch.py with plain subprocesses).

    worker.py SCENARIO RANK WORLD PORT OUT_JSON

Scenarios: ops (every collective vs gloo's result, random shapes/dtypes/ops, in place and
out of place, default group and a sub-group), ddp (training steps, parameters saved),
zero (ZeroRedundancyOptimizer), missing_peer, desync.
"""
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import loom_torch  # registers the "loom" backend

SCENARIO, RANK, WORLD, PORT, OUT = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
    int(sys.argv[4]), sys.argv[5]
FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
INTS = [torch.int32, torch.int64, torch.uint8]
R = dist.ReduceOp
SUB = [0, WORLD - 1]  # scenario_shared_from's sub-group


def data(seed, rank, shape, dtype):
    """The tensor rank `rank` contributes in case `seed` (any rank can make any rank's)."""
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    if dtype in FLOATS:
        return (torch.rand(shape, generator=g, dtype=torch.float64) * 4 - 2).to(dtype)
    hi = 5 if dtype == torch.uint8 else 100
    return torch.randint(0, hi, shape, generator=g, dtype=torch.int64).to(dtype)


def bits(t):
    """gloo moves no bfloat16: give it the same bytes as float16."""
    return t.view(torch.float16) if t.dtype == torch.bfloat16 else t


def close(a, b, what, over=1):
    """loom's result a against gloo's b, of an op that combined `over` ranks' values (1: data
    moved, not reduced). Moved data and integers must be equal; so must a float32/float64
    reduction of at most 2 ranks (a + b == b + a, and the average divides that by 2, exact);
    more ranks may add in another order: float64 within 1e-12 (a float64 reduction done in
    float32 is off by ~1e-7 and fails), float32 within 1e-6; 16-bit types, which gloo
    reduces in float64 here, within 2e-2."""
    if a.dtype != b.dtype or a.shape != b.shape:
        raise AssertionError("%s: %s %s vs %s %s" % (what, a.dtype, tuple(a.shape), b.dtype,
                                                     tuple(b.shape)))
    if over == 1 or a.dtype not in FLOATS:
        ok = torch.equal(bits(a), bits(b))
    elif a.dtype in (torch.bfloat16, torch.float16):
        ok = torch.allclose(a.double(), b.double(), rtol=2e-2, atol=2e-2)
    elif over <= 2:
        ok = torch.equal(a, b)
    elif a.dtype == torch.float64:
        ok = torch.allclose(a, b, rtol=1e-12, atol=1e-12)
    else:
        ok = torch.allclose(a, b, rtol=1e-6, atol=1e-6)
    if not ok:
        raise AssertionError("%s: loom %s\n gloo %s" % (what, a.flatten()[:8], b.flatten()[:8]))


def run_ops(group, gloo, ranks, seed0):
    """Each case runs the op on `group` (loom) and computes the expected result with gloo."""
    me = dist.get_rank(group)
    n = dist.get_world_size(group)
    rng = torch.Generator().manual_seed(seed0)
    count = 0
    for case in range(60):
        seed = seed0 * 100 + case
        dtype = (FLOATS + INTS)[int(torch.randint(0, 7, (1,), generator=rng))]
        shape = tuple(int(x) for x in torch.randint(1, 6, (int(torch.randint(1, 3, (1,),
                                                                              generator=rng)),),
                                                    generator=rng))
        ops = [R.SUM, R.MIN, R.MAX, R.PRODUCT] + ([R.AVG] if dtype in FLOATS else [])
        op = ops[int(torch.randint(0, len(ops), (1,), generator=rng))]
        if op == R.PRODUCT and dtype in (torch.bfloat16, torch.float16):
            op = R.SUM
        root = int(torch.randint(0, n, (1,), generator=rng))
        x = data(seed, me, shape, dtype)
        gop = R.SUM if op == R.AVG else op

        def reduced(t):  # gloo's allreduce of t (AVG as SUM / n, in double)
            y = t.double() if t.dtype in (torch.bfloat16, torch.float16) else t.clone()
            if y.dtype == torch.uint8 or y.dtype in (torch.int32, torch.int64):
                y = y.clone()
            dist.all_reduce(y, op=gop, group=gloo)
            if op == R.AVG:
                y = y / n
            return y.to(t.dtype)

        kind = case % 13
        if kind == 0:  # allreduce, in place; non-contiguous on odd cases
            t = x.clone()
            if case % 2 and t.dim() == 2 and t.shape[0] > 1:
                t = t.t()  # a transposed view: not contiguous
            want = reduced(t)
            dist.all_reduce(t, op=op, group=group)
            close(t, want, "allreduce %s %s %s" % (dtype, shape, op), n)
        elif kind == 1:  # broadcast
            t = x.clone()
            want = t.clone()
            dist.broadcast(bits(want), src=ranks[root], group=gloo)
            dist.broadcast(t, src=ranks[root], group=group)
            close(t, want, "broadcast")
        elif kind == 2:  # reduce
            t = x.clone()
            want = reduced(x)
            dist.reduce(t, dst=ranks[root], op=op, group=group)
            close(t, want if me == root else x, "reduce (rank %d, root %d)" % (me, root),
                  n if me == root else 1)
        elif kind == 3:  # all_gather (list)
            outs = [torch.empty(shape, dtype=dtype) for _ in range(n)]
            want = [torch.empty(shape, dtype=dtype) for _ in range(n)]
            dist.all_gather(outs, x, group=group)
            dist.all_gather([bits(w) for w in want], bits(x), group=gloo)
            for a, b in zip(outs, want):
                close(a, b, "all_gather")
        elif kind == 4:  # all_gather_into_tensor
            out = torch.empty((n,) + shape, dtype=dtype)
            want = [torch.empty(shape, dtype=dtype) for _ in range(n)]
            dist.all_gather_into_tensor(out, x, group=group)
            dist.all_gather([bits(w) for w in want], bits(x), group=gloo)
            close(out, torch.stack(want), "all_gather_into_tensor")
        elif kind == 5:  # reduce_scatter (list)
            ins = [data(seed + 7 * q, me, shape, dtype) for q in range(n)]
            out = torch.empty(shape, dtype=dtype)
            dist.reduce_scatter(out, ins, op=op, group=group)
            close(out, reduced(torch.stack(ins))[me], "reduce_scatter %s %s" % (dtype, op), n)
        elif kind == 6:  # reduce_scatter_tensor
            inp = data(seed, me, (n,) + shape, dtype)
            out = torch.empty(shape, dtype=dtype)
            dist.reduce_scatter_tensor(out, inp, op=op, group=group)
            close(out, reduced(inp)[me], "reduce_scatter_tensor %s %s" % (dtype, op), n)
        elif kind == 7:  # gather
            outs = [torch.empty(shape, dtype=dtype) for _ in range(n)] if me == root else None
            want = [torch.empty(shape, dtype=dtype) for _ in range(n)]
            dist.gather(x, outs, dst=ranks[root], group=group)
            dist.all_gather([bits(w) for w in want], bits(x), group=gloo)
            if me == root:
                for a, b in zip(outs, want):
                    close(a, b, "gather")
        elif kind == 8:  # scatter
            ins = [data(seed + 11 * q, root, shape, dtype) for q in range(n)]
            out = torch.empty(shape, dtype=dtype)
            dist.scatter(out, ins if me == root else None, src=ranks[root], group=group)
            close(out, ins[me], "scatter")
        elif kind == 9:  # all_to_all_single, even and with splits
            inp = data(seed, me, (n * 2,) + shape, dtype)
            out = torch.empty_like(inp)
            want = torch.empty_like(inp)
            dist.all_to_all_single(out, inp, group=group)
            dist.all_to_all_single(bits(want), bits(inp), group=gloo)
            close(out, want, "all_to_all_single")
            ins_split = [(me + q) % 3 + 1 for q in range(n)]  # rows this rank sends to q
            outs_split = [(q + me) % 3 + 1 for q in range(n)]  # rows q sends to this rank
            inp = data(seed + 1, me, (sum(ins_split),) + shape, dtype)
            out = torch.empty((sum(outs_split),) + shape, dtype=dtype)
            want = torch.empty_like(out)
            dist.all_to_all_single(out, inp, outs_split, ins_split, group=group)
            dist.all_to_all_single(bits(want), bits(inp), outs_split, ins_split, group=gloo)
            close(out, want, "all_to_all_single with splits")
        elif kind == 10:  # all_to_all (lists); gloo lacks it: expected from every rank's data
            ins = [data(seed + q, me, shape, dtype) for q in range(n)]
            outs = [torch.empty(shape, dtype=dtype) for _ in range(n)]
            dist.all_to_all(outs, ins, group=group)
            for q in range(n):
                close(outs[q], data(seed + me, q, shape, dtype), "all_to_all")
        elif kind == 11:  # all_reduce_coalesced
            ts = [data(seed + q, me, shape, dtype) for q in range(3)]
            want = [reduced(t) for t in ts]
            dist.all_reduce_coalesced(ts, op=op, group=group)
            for a, b in zip(ts, want):
                close(a, b, "all_reduce_coalesced", n)
        elif kind == 12:  # send / recv around a ring, plus all_gather_coalesced
            if n > 1:
                nxt, prv = (me + 1) % n, (me - 1) % n
                got = torch.empty(shape, dtype=dtype)
                if me % 2 == 0:
                    dist.send(x, ranks[nxt], group=group)
                    dist.recv(got, ranks[prv], group=group)
                else:
                    dist.recv(got, ranks[prv], group=group)
                    dist.send(x, ranks[nxt], group=group)
                close(got, data(seed, prv, shape, dtype), "send/recv")
            outs = [[torch.empty(shape, dtype=dtype)] for _ in range(n)]
            dist.all_gather_coalesced(outs, [x], group=group)
            for q in range(n):
                close(outs[q][0], data(seed, q, shape, dtype), "all_gather_coalesced")
        count += 1
    # async: several in flight, then wait; the future completes with the tensors.
    op = gop = R.SUM  # (reduced() reads these)
    ts = [data(seed0 + q, me, (1000,), torch.float32) for q in range(4)]
    want = [reduced(t) for t in ts]
    works = [dist.all_reduce(t, group=group, async_op=True) for t in ts]
    fut = works[-1].get_future()
    for w in works:
        w.wait()
        assert w.is_completed()
    assert torch.equal(fut.wait()[0], ts[-1])
    for a, b in zip(ts, want):
        close(a, b, "async all_reduce", n)
    dist.barrier(group=group)
    return count


def init(timeout=60):
    dist.init_process_group("loom", init_method="tcp://127.0.0.1:%d" % PORT, rank=RANK,
                            world_size=WORLD, timeout=timedelta(seconds=timeout))


def scenario_ops():
    init()
    gloo = dist.new_group(backend="gloo")
    n = run_ops(None, gloo, list(range(WORLD)), 1)
    sub = [r for r in range(WORLD) if r % 2 == 0] if WORLD > 2 else list(range(WORLD))
    lg = dist.new_group(sub)  # loom sub-group (the default backend)
    gg = dist.new_group(sub, backend="gloo")
    if RANK in sub:
        n += run_ops(lg, gg, sub, 2)
    # Refusals say what and why.
    msgs = []
    for fn in (lambda: dist.all_reduce(torch.ones(2, dtype=torch.bool)),
               lambda: dist.all_reduce(torch.ones(2), op=R.BAND)):
        try:
            fn()
        except RuntimeError as e:
            msgs.append(str(e).splitlines()[0])
    dist.barrier()
    return {"cases": n, "refusals": msgs}


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                               torch.nn.Tanh(), torch.nn.Linear(64, 8))


def scenario_ddp(backend):
    dist.init_process_group(backend, init_method="tcp://127.0.0.1:%d" % PORT, rank=RANK,
                            world_size=WORLD)
    torch.set_num_threads(1)
    m = torch.nn.parallel.DistributedDataParallel(model(), bucket_cap_mb=0.01)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(100 + RANK)
    losses = []
    for _ in range(20):
        x = torch.randn(16, 32, generator=g)
        y = torch.randn(16, 8, generator=g)
        opt.zero_grad()
        loss = ((m(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    params = [p.detach().flatten().tolist() for p in m.parameters()]
    dist.destroy_process_group()
    return {"params": params, "losses": losses}


def scenario_zero():
    init()
    from torch.distributed.optim import ZeroRedundancyOptimizer
    torch.set_num_threads(1)
    m = torch.nn.parallel.DistributedDataParallel(model())
    opt = ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.Adam, lr=1e-2)
    ref = model()  # one process doing the same steps on the whole batch
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    for step in range(10):
        xs = [torch.randn(8, 32, generator=torch.Generator().manual_seed(step * 10 + r))
              for r in range(WORLD)]
        opt.zero_grad()
        ((m(xs[RANK])) ** 2).mean().backward()
        opt.step()
        ref_opt.zero_grad()
        (torch.stack([(ref(x) ** 2).mean() for x in xs]).mean()).backward()
        ref_opt.step()
    diff = max((a - b).abs().max().item() for a, b in zip(m.parameters(), ref.parameters()))
    return {"max_diff": diff}


def scenario_missing_peer():
    init(timeout=3)
    if RANK == 1:
        time.sleep(3 + 5 + 1)  # never joins the collective while rank 0 waits (its bound: 8 s)
        return {}
    t0 = time.time()
    w = dist.all_reduce(torch.ones(10), async_op=True)
    try:
        w.wait()
        return {"raised": False}
    except RuntimeError as e:
        return {"raised": True, "after_s": time.time() - t0, "msg": str(e).splitlines()[0]}


def scenario_desync():
    init(timeout=20)
    t = torch.ones(1000)
    try:
        if RANK == 0:
            dist.all_reduce(t)
        else:
            dist.broadcast(t, src=0)
        return {"raised": False}
    except RuntimeError as e:
        return {"raised": True, "msg": str(e)}


def scenario_p2p_and_bytes():
    """Fixes found by PyTorch's own suite (issue 16): data movement in dtypes loom does not
    reduce; torch's batch_isend_irecv posting every irecv before its isend, on every rank,
    with messages larger than a shared-memory ring (both sides block until the other reads)."""
    init()
    checks = 0
    for dt in (torch.int8, torch.bool, torch.int16, torch.complex64):
        src = (torch.arange(1000) % 7 == RANK).to(dt) if dt == torch.bool else \
            (torch.arange(1000) * (RANK + 1)).to(dt)
        t = src.clone() if RANK == 1 else torch.zeros(1000, dtype=dt)
        dist.broadcast(t, 1)
        want = (torch.arange(1000) % 7 == 1).to(dt) if dt == torch.bool else \
            (torch.arange(1000) * 2).to(dt)
        assert torch.equal(t, want), (dt, t[:8])
        outs = [torch.zeros(1000, dtype=dt) for _ in range(WORLD)]
        dist.all_gather(outs, src)
        for r in range(WORLD):
            w = (torch.arange(1000) % 7 == r).to(dt) if dt == torch.bool else \
                (torch.arange(1000) * (r + 1)).to(dt)
            assert torch.equal(outs[r], w), (dt, r)
        checks += 1
    n = 3 << 20  # 12 MiB of float32: larger than the 4 MiB ring, so a send waits for its reader
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    for rounds in range(3):
        out = torch.full((n,), float(RANK * 10 + rounds))
        got_prev, got_next = torch.empty(n), torch.empty(n)
        ops = [dist.P2POp(dist.irecv, got_prev, prv), dist.P2POp(dist.irecv, got_next, nxt),
               dist.P2POp(dist.isend, out, nxt), dist.P2POp(dist.isend, out, prv)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        assert got_prev[0].item() == prv * 10 + rounds and got_prev[-1].item() == prv * 10 + rounds
        assert got_next[0].item() == nxt * 10 + rounds and got_next[-1].item() == nxt * 10 + rounds
        checks += 1
    dist.barrier()
    return {"checks": checks}


def scenario_monitored_barrier():
    """pg.monitored_barrier (dist.monitored_barrier admits only gloo in torch 1.13): passes
    when every rank arrives; names the rank that does not."""
    init()
    pg = dist.distributed_c10d._get_default_group()
    pg.monitored_barrier(timedelta(seconds=20))
    pg.monitored_barrier(timedelta(seconds=20), wait_all_ranks=True)
    msg = ""
    if RANK != 1:  # rank 1 stays away
        try:
            pg.monitored_barrier(timedelta(seconds=2))
        except RuntimeError as e:
            msg = str(e)
    else:
        time.sleep(6)
    return {"msg": msg}


def scenario_shared_from():
    """loom_torch.use_shared_memory() on every rank before the group (LOOM_TORCH_SHARED_ONLY
    names the ranks that turn it on; default all): from its 64 KiB minimum on, tensors are
    shared and the group knows it, so allreduces below the shared algorithm's 1 MiB run
    fused. Smaller tensors and one allocated before the allocator was on take the heap
    paths; every result is the closed form."""
    on = os.environ.get("LOOM_TORCH_SHARED_ONLY")
    early = torch.full((1 << 16,), float(RANK + 1))  # 256 KiB on torch's own heap
    if on is None or str(RANK) in on.split(","):
        loom_torch.use_shared_memory()
    init()
    total = WORLD * (WORLD + 1) / 2
    fused = {}

    def allreduce(name, t, group=None):
        before = loom_torch.fused_allreduces()
        dist.all_reduce(t, group=group)
        want = total if group is None else float(sum(r + 1 for r in SUB))
        if not torch.equal(t, torch.full_like(t, want)):
            raise AssertionError("%s: %s, want %s" % (name, t[:4].tolist(), want))
        fused[name] = loom_torch.fused_allreduces() - before

    allreduce("64K", torch.full((1 << 14,), float(RANK + 1)))
    allreduce("256K", torch.full((1 << 16,), float(RANK + 1)))
    allreduce("4K", torch.full((1 << 10,), float(RANK + 1)))
    allreduce("early", early)
    # reduce_scatter_tensor from a shared 3 x 64 KiB input: each rank's block of the sums
    full = torch.cat([torch.full((1 << 14,), float((RANK + 1) * (b + 1))) for b in range(WORLD)])
    out = torch.empty(1 << 14)
    dist.reduce_scatter_tensor(out, full)
    if not torch.equal(out, torch.full_like(out, total * (RANK + 1))):
        raise AssertionError("reduce_scatter: %s" % out[:4].tolist())
    group = dist.new_group(SUB)  # a sub-group agrees on its own
    if RANK in SUB:
        allreduce("sub 64K", torch.full((1 << 14,), float(RANK + 1)), group)
    dist.barrier()
    return {"fused": fused}


def scenario_any_source():
    """recv without a source, mixed with a named recv."""
    init()
    got = []
    if RANK == 1:
        dist.send(torch.full((4,), 10.0), 0)
        dist.send(torch.full((4,), 11.0), 0)
    elif RANK == 2:
        dist.send(torch.full((4,), 20.0), 0)
    else:
        t = torch.empty(4)
        dist.recv(t, src=1)
        got.append([1, t[0].item()])
        for _ in range(2):
            src = dist.recv(t)  # any source: returns the sender
            got.append([src, t[0].item()])
    dist.barrier()
    return {"got": got}


def scenario_destroy_pending_send():
    """The group destroyed while its worker thread still runs a send of a tensor only the
    send keeps (Python's reference dropped): the worker's last reference to the tensor frees
    its Python object, which takes the GIL, so destroying the group must not hold the GIL
    while it waits for the worker (it did: a deadlock, seen as a rare hang at a test's end)."""
    N = 4 << 20
    init()
    if RANK == 0:
        t = torch.full((N,), 7.0)  # larger than a shared-memory ring: the send waits for rank 1
        dist.isend(t, 1)
        del t
        start = time.time()
        dist.destroy_process_group()  # the group's last reference: ~ProcessGroupLoom
        return {"destroy_s": time.time() - start}
    time.sleep(1.0)  # rank 0 is destroying its group by now, its send still waiting for us
    t = torch.empty(N)
    dist.recv(t, 0)
    dist.destroy_process_group()
    return {"got": [t.min().item(), t.max().item()]}


if __name__ == "__main__":
    fn = {"ops": scenario_ops, "ddp_loom": lambda: scenario_ddp("loom"),
          "ddp_gloo": lambda: scenario_ddp("gloo"), "zero": scenario_zero,
          "missing_peer": scenario_missing_peer, "desync": scenario_desync,
          "any_source": scenario_any_source, "p2p_and_bytes": scenario_p2p_and_bytes,
          "monitored_barrier": scenario_monitored_barrier,
          "shared_from": scenario_shared_from,
          "destroy_pending_send": scenario_destroy_pending_send}[SCENARIO]
    result = fn()
    # the shared-memory allocator's counters and the fused allreduces this rank ran
    result["shared_memory"] = loom_torch.shared_memory_stats()
    result["fused_allreduces"] = loom_torch.fused_allreduces()
    with open(OUT, "w") as f:
        json.dump(result, f)
    sys.stdout.flush()
    os._exit(0)  # the missing-peer and desync cases leave a broken group behind
