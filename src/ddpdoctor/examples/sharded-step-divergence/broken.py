"""F11 sharded-step-divergence: an evaluation loop over per-rank data of unequal length, on an FSDP2 model.

Run: torchrun --nproc-per-node 2 examples/sharded-step-divergence/broken.py
The 7 validation batches are split by rank: rank 0 gets 4, rank 1 gets 3. Every forward of a `fully_shard`
model all-gathers its parameters, so rank 0's fourth `model(x)` waits in an all-gather that rank 1 never
joins: rank 1 is already in the `all_reduce` of the metric. No user line is in the collective's stack;
without the guard the job hangs until the process group's timeout (DDPDOCTOR_EXAMPLE_TIMEOUT seconds,
default 10, here; 30 minutes for gloo, 10 for NCCL by default).
"""

import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

TIMEOUT = float(os.environ.get("DDPDOCTOR_EXAMPLE_TIMEOUT", "10"))

dist.init_process_group(backend="gloo", timeout=timedelta(seconds=TIMEOUT))
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
for layer in model:
    if isinstance(layer, nn.Linear):
        fully_shard(layer)
fully_shard(model)

validation = [torch.randn(8, 16) for _ in range(7)]
mine = validation[rank::world]  # 4 batches on rank 0, 3 on rank 1
total = torch.zeros(1)
with torch.no_grad():
    for x in mine:
        total += model(x).pow(2).mean()  # rank 0's fourth pass has no partner
dist.all_reduce(total)
print(f"rank {rank}: validation loss {total.item() / len(validation):.4f}", flush=True)
dist.destroy_process_group()
