"""F7 sampler-epoch (second form): a plain shuffled DataLoader in a hand-written DDP loop.

Run: torchrun --nproc-per-node 2 examples/sampler-epoch/unsharded_broken.py
Nothing crashes. Without a DistributedSampler every rank iterates over the whole dataset, so an "epoch" is
world_size epochs of work on overlapping batches. The last lines (not part of the bug) gather which samples
each rank saw and exit 1 when the ranks did not split the data.
"""

import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

dist.init_process_group(backend="gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(1, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

dataset = TensorDataset(torch.arange(16, dtype=torch.float32).unsqueeze(1))
loader = DataLoader(dataset, batch_size=4, shuffle=True)  # the whole dataset, on every rank

seen = []
for epoch in range(2):
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
