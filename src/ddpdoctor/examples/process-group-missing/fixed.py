"""F9 process-group-missing, fixed: the process group exists before anything communicates.

Run: torchrun --nproc-per-node 2 examples/process-group-missing/fixed.py
or:  python examples/process-group-missing/fixed.py      (one process: no DDP, no process group)
`init_process_group` comes first; and when the launcher did not set RANK/WORLD_SIZE the script runs as a
single process instead of failing on missing environment variables.
"""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def build_model():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    return DDP(model) if dist.is_initialized() else model


def setup():
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun (or SLURM + env)
        dist.init_process_group(backend="gloo")


setup()
model = build_model()
loss = model(torch.randn(8, 4)).pow(2).mean()
loss.backward()
rank = dist.get_rank() if dist.is_initialized() else 0
print(f"rank {rank}: loss {loss.item():.4f}")
if dist.is_initialized():
    dist.barrier()  # no rank tears the group down while a peer still uses it
    dist.destroy_process_group()
