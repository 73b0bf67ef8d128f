"""F9 process-group-missing: DDP (a collective) used before `init_process_group`.

Run: torchrun --nproc-per-node 2 examples/process-group-missing/broken.py
The model is wrapped while the script is still being set up; `DistributedDataParallel` broadcasts the
parameters from rank 0 in its constructor, and there is no default process group yet:
`ValueError: Default process group has not been initialized, please make sure to call init_process_group.`
(Run with plain `python` instead of torchrun and the same script fails in `init_process_group` with
`environment variable RANK expected, but not set`: torchrun is what sets RANK, WORLD_SIZE, MASTER_ADDR ...)
"""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def build_model():
    torch.manual_seed(0)
    return DDP(torch.nn.Linear(4, 1))  # needs the default process group


def setup():
    dist.init_process_group(backend="gloo")


model = build_model()
setup()  # too late
loss = model(torch.randn(8, 4)).pow(2).mean()
loss.backward()
print(f"rank {dist.get_rank()}: loss {loss.item():.4f}")
dist.destroy_process_group()
