"""F4 collective-divergence (plain torch.distributed): a collective only rank 0 calls.

Run: torchrun --nproc-per-node 2 examples/collective-divergence/broken.py
Rank 0 waits in all_reduce, rank 1 waits in barrier: nobody moves until the process group's timeout
(30 min by default with gloo, 10 min with NCCL). This example sets the timeout from
DDPDOCTOR_EXAMPLE_TIMEOUT (seconds, default 10) so it fails instead of hanging for half an hour.
"""

import os
from datetime import timedelta

import torch
import torch.distributed as dist

timeout = timedelta(seconds=float(os.environ.get("DDPDOCTOR_EXAMPLE_TIMEOUT", "10")))
dist.init_process_group(backend="gloo", timeout=timeout)
rank = dist.get_rank()

loss = torch.tensor([1.0 + rank])
if rank == 0:
    dist.all_reduce(loss)  # only rank 0 gets here: the ranks no longer call the same collectives
    print(f"mean loss: {loss.item() / dist.get_world_size():.2f}")

dist.barrier()  # rank 1 is already here, waiting for a barrier that rank 0 never reaches
print(f"rank {rank}: done")
dist.destroy_process_group()
