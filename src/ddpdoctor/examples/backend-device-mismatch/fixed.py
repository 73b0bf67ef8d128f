"""F1 backend-device-mismatch, fixed: the tensor lives where the group has a backend for it.

Run: torchrun --nproc-per-node 2 examples/backend-device-mismatch/fixed.py
"""

import os

import torch
import torch.distributed as dist

if torch.cuda.is_available():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    # Both device types get a backend, so a stray CPU tensor is reduced over gloo instead of failing.
    backend = "cpu:gloo,cuda:nccl"
else:
    device = torch.device("cpu")
    backend = "cpu:gloo,cuda:gloo"
dist.init_process_group(backend=backend)
rank = dist.get_rank()

n_correct = 40 + rank
total = torch.tensor(n_correct, device=device)  # fix 1: create it on the rank's device
dist.all_reduce(total)

if rank == 0:
    print(f"correct predictions over all ranks: {total.item()}")
dist.barrier()  # no rank tears the group down while a peer still uses it
dist.destroy_process_group()
