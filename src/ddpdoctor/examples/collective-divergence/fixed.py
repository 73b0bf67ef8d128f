"""F4 collective-divergence (plain torch.distributed), fixed: every rank calls the collective.

Run: torchrun --nproc-per-node 2 examples/collective-divergence/fixed.py
Only the side effect (the print) is guarded by the rank test.
"""

import os
from datetime import timedelta

import torch
import torch.distributed as dist

timeout = timedelta(seconds=float(os.environ.get("DDPDOCTOR_EXAMPLE_TIMEOUT", "10")))
dist.init_process_group(backend="gloo", timeout=timeout)
rank = dist.get_rank()

loss = torch.tensor([1.0 + rank])
dist.all_reduce(loss)  # every rank, same order, same shape
if rank == 0:
    print(f"mean loss: {loss.item() / dist.get_world_size():.2f}")

dist.barrier()
print(f"rank {rank}: done")
dist.destroy_process_group()
