"""F13 single-rank-long-section: rank 0 evaluates alone while rank 1 already waits in `barrier()`.

Run: torchrun --nproc-per-node 2 examples/single-rank-long-section/broken.py
Rank 0 runs the whole validation set through the model on its own; rank 1 goes straight to the barrier
after training. Nothing is wrong with the order of collectives, rank 0 is only slow: but the evaluation
takes 1.5 times the process group's timeout, so rank 1 fails in `barrier()` with gloo's `Timed out
waiting ...ms` (NCCL: a watchdog timeout after 10 minutes). The timeout is DDPDOCTOR_EXAMPLE_TIMEOUT
seconds (default 10) here.
"""

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

TIMEOUT = float(os.environ.get("DDPDOCTOR_EXAMPLE_TIMEOUT", "10"))


def evaluate(model, seconds):
    """Stands for a pass over a large validation set: real work on the CPU for `seconds`."""
    batches = 0
    started = time.monotonic()
    with torch.no_grad():
        while time.monotonic() - started < seconds:
            model(torch.randn(64, 256))
            batches += 1
    return batches


dist.init_process_group(backend="gloo", timeout=timedelta(seconds=TIMEOUT))
rank = dist.get_rank()
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))

if rank == 0:
    batches = evaluate(model, 1.5 * TIMEOUT)  # the whole validation set, on rank 0 alone
    print(f"rank 0: evaluated {batches} batches", flush=True)
dist.barrier()  # rank 1 waits here past the timeout
print(f"rank {rank}: next epoch", flush=True)
dist.destroy_process_group()
