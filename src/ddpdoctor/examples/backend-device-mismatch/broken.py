"""F1 backend-device-mismatch: a CPU tensor handed to a group that has a backend for cuda only.

Run: torchrun --nproc-per-node 2 examples/backend-device-mismatch/broken.py
Fails on every rank with: RuntimeError: No backend type associated with device type cpu
"""

import os

import torch
import torch.distributed as dist

if torch.cuda.is_available():
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
# NCCL registers a backend for the cuda device type only. On a CPU box `cuda:gloo` does the same: gloo for
# cuda tensors, nothing for cpu ones.
dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "cuda:gloo")
rank = dist.get_rank()

n_correct = 40 + rank  # a Python number, e.g. counted while evaluating this rank's shard
total = torch.tensor(n_correct)  # no device: the tensor is created on the CPU
dist.all_reduce(total)  # RuntimeError: No backend type associated with device type cpu

if rank == 0:
    print(f"correct predictions over all ranks: {total.item()}")
dist.destroy_process_group()
