"""F6 dead-rank, fixed: every rank keeps only its shard, and failures are recorded for torchrun.

Run: torchrun --nproc-per-node 2 examples/dead-rank/fixed.py
`@record` makes a Python exception on any rank show up in torchrun's summary (the error file) instead of
"To enable traceback see ..."; the final barrier makes the ranks finish together.
"""

import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    timeout = timedelta(seconds=float(os.environ.get("DDPDOCTOR_EXAMPLE_TIMEOUT", "10")))
    dist.init_process_group(backend="gloo", timeout=timeout)
    rank = dist.get_rank()
    weights = torch.zeros(8)
    for step in range(5):
        grad = torch.full((8,), float(rank + step))  # this rank's shard only: memory stays flat
        dist.all_reduce(grad)
        weights -= 0.1 * grad / dist.get_world_size()
        print(f"rank {rank}: step {step} done", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
