"""A plain torch.distributed script: env:// rendezvous, as `loom run -n N` (or torchrun)
starts it. Prints one line per rank for test_loom_torch.py."""
import os
import time

import torch
import torch.distributed as dist

import loom_torch  # noqa: F401

dist.init_process_group("loom")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
t = torch.ones(4) * (dist.get_rank() + 1)
dist.all_reduce(t)
print("rank %d of %d: sum %g" % (dist.get_rank(), dist.get_world_size(), t[0].item()), flush=True)
if os.environ.get("LOOM_TEST_LINGER"):  # test_ranks_die_with_their_launcher
    time.sleep(60)
dist.destroy_process_group()
