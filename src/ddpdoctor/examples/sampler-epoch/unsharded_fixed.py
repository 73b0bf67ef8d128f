"""F7 sampler-epoch (second form), fixed: a DistributedSampler shards the data, `set_epoch` reshuffles it.

Run: torchrun --nproc-per-node 2 examples/sampler-epoch/unsharded_fixed.py
Each rank gets a disjoint 1/world_size of the dataset per epoch, in an order that changes every epoch.
"""

import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group(backend="gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(1, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

dataset = TensorDataset(torch.arange(16, dtype=torch.float32).unsqueeze(1))
sampler = DistributedSampler(dataset, shuffle=True)
loader = DataLoader(dataset, batch_size=4, sampler=sampler)  # this rank's shard

seen = []
for epoch in range(2):
    sampler.set_epoch(epoch)
    for (x,) in loader:
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if epoch == 0:
            seen.extend(int(v) for v in x.flatten())

# --- not part of the bug: did the ranks split the data? -----------------------------------------------------
everyone = [None] * dist.get_world_size()
dist.all_gather_object(everyone, sorted(seen))
overlap = set(everyone[0]).intersection(*everyone[1:])
if rank == 0:
    print(f"samples per rank in epoch 0: {[len(s) for s in everyone]}; seen by every rank: {len(overlap)}")
dist.barrier()  # no rank tears the group down while a peer still uses it
dist.destroy_process_group()
sys.exit(1 if overlap else 0)
