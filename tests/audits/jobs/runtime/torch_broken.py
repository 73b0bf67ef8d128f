"""F10 + F3 under torchrun, broken: every rank saves the initial weights to the same file, and a submodule
built on the meta device (deferred initialisation) is never materialised before DDP wraps the model.

torchrun --nproc-per-node 2 torch_broken.py OUT_DIR
"""

import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
out = sys.argv[1]
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
with torch.device("meta"):
    model.append(nn.Linear(2, 2))  # the head, to be materialised later (it never is)

torch.save(model[0].state_dict(), os.path.join(out, "init.pt"))  # line: every rank saves
ddp = DistributedDataParallel(model)  # line: wrap
print(f"rank {dist.get_rank()}: done")
dist.destroy_process_group()
