"""F13 single-rank-long-section, fixed: every rank evaluates its shard of the validation set, and the
metric is all-reduced, so no rank waits for another past the timeout.

Run: torchrun --nproc-per-node 2 examples/single-rank-long-section/fixed.py
(Where one rank must do long work alone, the other fix is a group whose timeout is sized for it:
`dist.new_group(timeout=timedelta(hours=1))` for the barrier that follows it.)
"""

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

TIMEOUT = float(os.environ.get("DDPDOCTOR_EXAMPLE_TIMEOUT", "10"))


def evaluate(model, seconds):
    batches = 0
    started = time.monotonic()
    with torch.no_grad():
        while time.monotonic() - started < seconds:
            model(torch.randn(64, 256))
            batches += 1
    return batches


dist.init_process_group(backend="gloo", timeout=timedelta(seconds=TIMEOUT))
rank, world = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))

batches = torch.tensor([evaluate(model, 0.3 * TIMEOUT / world)])  # this rank's shard of the set
dist.all_reduce(batches)  # the whole set's count, on every rank
if rank == 0:
    print(f"rank 0: evaluated {int(batches)} batches on {world} ranks", flush=True)
dist.barrier()
print(f"rank {rank}: next epoch", flush=True)
dist.destroy_process_group()
