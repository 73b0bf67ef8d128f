"""F12 replica-divergence: gradient accumulation whose `no_sync()` wraps every micro-batch.

Run: torchrun --nproc-per-node 2 examples/replica-divergence/broken.py
DDP skips the gradient all_reduce inside `no_sync()`. Accumulation is meant to sync on the last
micro-batch of each step; here every micro-batch runs under `no_sync()`, so the gradients are never
averaged, each rank steps on its own data, and the replicas drift apart. Nothing fails: the job ends
with exit 0, and the checkpoint rank 0 saves holds rank 0's model only.
"""

import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

ACCUMULATE = 4

dist.init_process_group(backend="gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
torch.manual_seed(1 + rank)  # each rank its own shard of the data

for step in range(3):
    for micro in range(ACCUMULATE):
        x, y = torch.randn(4, 8), torch.randn(4, 2)
        with model.no_sync():  # every micro-batch: the sync step is never reached
            torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()

# --- not part of the bug: compare the replicas, which the bug leaves different -----------------------------
checksum = torch.stack([p.detach().double().sum() for p in model.parameters()]).sum().reshape(1)
every = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size())]
dist.all_gather(every, checksum)
same = all(torch.equal(every[0], other) for other in every)
print(f"rank {rank}: replicas equal: {same}", flush=True)
dist.destroy_process_group()
sys.exit(0 if same else 1)
