"""F11 sharded-step-divergence, fixed: every rank runs the same number of forward passes; a rank without
a batch of its own runs a padding batch whose result it leaves out.

Run: torchrun --nproc-per-node 2 examples/sharded-step-divergence/fixed.py
(`DistributedSampler` pads the same way for a DataLoader; for `generate()` on a sharded model, pass
`synced_gpus=True`.)
"""

import math
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
mine = validation[rank::world]
passes = math.ceil(len(validation) / world)  # the same count on every rank
total = torch.zeros(1)
with torch.no_grad():
    for i in range(passes):
        x = mine[i] if i < len(mine) else torch.zeros(8, 16)  # padding: computed, not counted
        loss = model(x).pow(2).mean()
        if i < len(mine):
            total += loss
dist.all_reduce(total)
print(f"rank {rank}: validation loss {total.item() / len(validation):.4f}", flush=True)
dist.destroy_process_group()
