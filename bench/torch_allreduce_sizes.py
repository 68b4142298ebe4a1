#!/usr/bin/python3
"""loom_torch all_reduce at a few sizes, from torch's heap or loom's shared memory (docs/perf.md, the
shared_from row): median after a barrier and back to back, the slowest rank's.

    PYTHONPATH=build/python /usr/bin/python3 bench/torch_allreduce_sizes.py shm|heap WORLD [SIZES]
"""
import os, sys, time, statistics
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "python"))
def worker(mode, rank, world, port, sizes):
    import torch, torch.distributed as dist
    import loom_torch
    if mode == "shm": loom_torch.use_shared_memory()
    torch.set_num_threads(1)
    dist.init_process_group("loom", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world)
    for nbytes in sizes:
        n = nbytes // 4 // world * world
        x = torch.ones(n)
        dist.all_reduce(x)
        times = []
        for _ in range(40):
            dist.barrier()
            t0 = time.perf_counter(); dist.all_reduce(x); times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(40): dist.all_reduce(x)
        b2b = (time.perf_counter() - t0) / 40
        t = torch.tensor([statistics.median(times), b2b], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if rank == 0: print(f"{mode} {world} {nbytes>>10:6d} KiB  after-barrier {t[0].item()*1e6:8.1f} us  back-to-back {t[1].item()*1e6:8.1f} us", flush=True)
    dist.destroy_process_group()
if __name__ == "__main__":
    if sys.argv[1] == "w":
        worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), [int(s) for s in sys.argv[6].split(",")])
    else:
        import subprocess, socket
        mode, world = sys.argv[1], int(sys.argv[2])
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        sizes = sys.argv[3] if len(sys.argv) > 3 else "262144,524288,1048576,2097152,4194304"
        env = dict(os.environ, OMP_NUM_THREADS="1")
        ps = [subprocess.Popen([sys.executable, __file__, "w", mode, str(r), str(world), str(port), sizes], env=env) for r in range(world)]
        for p in ps: p.wait()
