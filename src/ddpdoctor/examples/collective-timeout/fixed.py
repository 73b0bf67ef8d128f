"""F6 collective-timeout, fixed: the slow step is split over every rank, so no rank waits past the timeout.

Run: torchrun --nproc-per-node 2 examples/collective-timeout/fixed.py
Each rank tokenises its share of the corpus and the parts are exchanged with `all_gather_object`. (When a
long one-rank step is legitimate and bounded, the other fix is a timeout sized for it:
`init_process_group(..., timeout=timedelta(minutes=60))`.)
"""

import os
import time
from datetime import timedelta

import torch.distributed as dist

TIMEOUT = float(os.environ.get("DDPDOCTOR_EXAMPLE_TIMEOUT", "10"))
WORK_ITEMS = 6


def build_vocabulary(items):
    vocabulary = set()
    for item in items:
        time.sleep(1.5 * TIMEOUT / WORK_ITEMS)
        vocabulary.add(f"token-{item}")
    return vocabulary


dist.init_process_group(backend="gloo", timeout=timedelta(seconds=TIMEOUT))
rank, world = dist.get_rank(), dist.get_world_size()

mine = build_vocabulary(range(rank, WORK_ITEMS, world))  # 1.5 / world_size x the timeout on each rank
parts = [None] * world
dist.all_gather_object(parts, mine)
vocabulary = set().union(*parts)
if rank == 0:
    print(f"rank 0: vocabulary of {len(vocabulary)} tokens", flush=True)
dist.barrier()
print(f"rank {rank}: training starts")
dist.destroy_process_group()
