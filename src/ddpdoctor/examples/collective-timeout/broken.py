"""F6 collective-timeout: rank 0 does slow one-rank work inside the synchronised region.

Run: torchrun --nproc-per-node 2 examples/collective-timeout/broken.py
Rank 0 builds a vocabulary alone while rank 1 already waits in `barrier()`. The work takes longer than the
process group's timeout, so rank 1 (the victim, not the culprit) fails with gloo's
`Timed out waiting ...ms`; with NCCL the watchdog reports the same after 10 minutes. The timeout is
DDPDOCTOR_EXAMPLE_TIMEOUT seconds (default 10) here, and the slow step takes 1.5 times that.
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
        time.sleep(1.5 * TIMEOUT / WORK_ITEMS)  # stands for tokenising one file of the corpus
        vocabulary.add(f"token-{item}")
    return vocabulary


dist.init_process_group(backend="gloo", timeout=timedelta(seconds=TIMEOUT))
rank = dist.get_rank()

if rank == 0:
    vocabulary = build_vocabulary(range(WORK_ITEMS))  # 1.5 x the timeout, on rank 0 alone
    print(f"rank 0: vocabulary of {len(vocabulary)} tokens", flush=True)
dist.barrier()  # rank 1 waits here past the timeout
print(f"rank {rank}: training starts")
dist.destroy_process_group()
