"""F7 sampler-epoch, fixed: `sampler.set_epoch(epoch)` at the start of every epoch.

Run: torchrun --nproc-per-node 2 examples/sampler-epoch/fixed.py
The shuffle is seeded with `seed + epoch`, identical on every rank (so the shards still partition the data)
and different from one epoch to the next. Lightning calls `set_epoch` for you; plain loops must.
"""

import sys

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group(backend="gloo")
rank = dist.get_rank()

dataset = TensorDataset(torch.arange(16))
sampler = DistributedSampler(dataset, shuffle=True)
loader = DataLoader(dataset, batch_size=4, sampler=sampler)

orders = []
for epoch in range(3):
    sampler.set_epoch(epoch)
    seen = []
    for (batch,) in loader:
        seen.extend(int(i) for i in batch)  # stands for the training step
    orders.append(seen)
    print(f"rank {rank} epoch {epoch}: {seen}", flush=True)

# --- not part of the bug: an unshuffled epoch order is what the bug looks like ----------------------------
repeated = all(order == orders[0] for order in orders[1:])
print(f"rank {rank}: every epoch saw the same order: {repeated}")
dist.barrier()  # no rank leaves while another is still setting up its connections
dist.destroy_process_group()
sys.exit(1 if repeated else 0)
