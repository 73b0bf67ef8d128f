"""F1 backend-device-mismatch: a CPU tensor handed to a group that has a backend for cuda only.

Run: torchrun --nproc-per-node 2 examples/backend-device-mismatch/broken.py
Fails on every rank with: RuntimeError: No backend type associated with device type cpu
"""

import os

import torch
import torch.distributed as dist

if torch.cuda.is_available():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    backend = "nccl"  # registers a backend for the cuda device type only
else:
    # `cuda:gloo` registers gloo for cuda tensors and nothing for cpu ones: the NCCL situation, on a CPU box.
    backend = "cuda:gloo"
dist.init_process_group(backend=backend)
rank = dist.get_rank()

n_correct = 40 + rank  # a Python number, e.g. counted while evaluating this rank's shard
total = torch.tensor(n_correct)  # no device: the tensor is created on the CPU
dist.all_reduce(total)  # RuntimeError: No backend type associated with device type cpu

if rank == 0:
    print(f"correct predictions over all ranks: {total.item()}")
dist.destroy_process_group()
