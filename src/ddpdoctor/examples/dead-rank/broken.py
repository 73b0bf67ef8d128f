"""F6 dead-rank: one rank is killed mid-training (here: the way the kernel's OOM killer ends it).

Run: torchrun --nproc-per-node 2 examples/dead-rank/broken.py
Rank 1 loads the whole dataset into memory "to be fast" and is killed with SIGKILL at step 3: no Python
traceback, no message from rank 1 at all. Rank 0 is left in the gradient all_reduce and reports
`Connection reset by peer` or `Connection closed by peer` (with NCCL: a watchdog timeout minutes later);
torchrun reports `Signal 9 (SIGKILL) received by PID ...` for rank 1.
"""

import os
import signal
from datetime import timedelta

import torch
import torch.distributed as dist

timeout = timedelta(seconds=float(os.environ.get("DDPDOCTOR_EXAMPLE_TIMEOUT", "10")))
dist.init_process_group(backend="gloo", timeout=timeout)
rank = dist.get_rank()
weights = torch.zeros(8)

for step in range(5):
    if rank == 1 and step == 3:
        # Stands for the OOM killer: the process vanishes without running any Python cleanup.
        print(f"rank 1: step {step}: loading the full dataset into memory ...", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    grad = torch.full((8,), float(rank + step))
    dist.all_reduce(grad)  # rank 0 waits here for a peer that no longer exists
    weights -= 0.1 * grad / dist.get_world_size()
    print(f"rank {rank}: step {step} done", flush=True)

dist.barrier()
dist.destroy_process_group()
