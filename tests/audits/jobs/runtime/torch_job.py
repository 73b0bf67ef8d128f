"""F10 + F3 under torchrun: `torchrun --nproc-per-node 2 torch_job.py OUT_DIR broken|fixed` (gloo, CPU).

broken: every rank saves the initial weights to the same file, and a head built on the meta device
(deferred initialisation) is never materialised before DDP wraps the model (DDP's constructor then raises
`input module must be on the same type of devices`).
fixed: the head is materialised on the rank's device before the wrap; the shared checkpoint is written by
global rank 0 only, followed by a barrier, and per-rank state goes to per-rank files; then the fixed
loaders of ../loaders/torch_loop.py (their test, tests/audits/test_runtime_loaders.py, reads this run: one
2-rank job for both fixed forms).
"""

import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
out, variant = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
with torch.device("meta"):
    model.append(nn.Linear(2, 2))  # the head, to be materialised once its initialisation is known

if variant == "broken":
    torch.save(model[0].state_dict(), os.path.join(out, "init.pt"))  # line: every rank saves
else:
    model[3].to_empty(device="cpu")
    model[3].reset_parameters()
    if rank == 0:
        torch.save(model.state_dict(), os.path.join(out, "init.pt"))
    dist.barrier()

ddp = DistributedDataParallel(model)  # line: wrap
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
for _epoch in range(2):
    ddp(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    if rank == 0:
        torch.save(model.state_dict(), os.path.join(out, "last.pt"))
    torch.save(optimizer.state_dict(), os.path.join(out, f"optimizer-rank{rank}.pt"))  # one file per rank
    dist.barrier()
if variant == "fixed":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "loaders"))
    from torch_loop import loops

    loops("fixed")
print(f"rank {rank}: done")
dist.destroy_process_group()
