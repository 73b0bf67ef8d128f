"""F10 + F3 under torchrun, fixed: the head is materialised on the rank's device before DDP wraps the model;
the shared checkpoint is written by global rank 0 only (then a barrier), per-rank state to per-rank files.

torchrun --nproc-per-node 2 torch_fixed.py OUT_DIR
"""

import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
out = sys.argv[1]
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
with torch.device("meta"):
    model.append(nn.Linear(2, 2))
model[3].to_empty(device="cpu")
model[3].reset_parameters()

ddp = DistributedDataParallel(model)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
for _epoch in range(2):
    ddp(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    if rank == 0:
        torch.save(model.state_dict(), os.path.join(out, "last.pt"))
    torch.save(optimizer.state_dict(), os.path.join(out, f"optimizer-rank{rank}.pt"))  # one file per rank
    dist.barrier()
print(f"rank {rank}: done")
dist.destroy_process_group()
