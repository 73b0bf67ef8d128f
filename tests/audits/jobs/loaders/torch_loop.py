"""A plain torch loop under torchrun (gloo, CPU). Mode `broken`: two shuffling DistributedSamplers whose
epoch never moves, one iterated inline and one in a helper function, and a loader that shuffles with a
RandomSampler only (the runtime DDP502). Mode `fixed`: the same loaders done right, plus what must stay
silent: a `next(iter(loader))` peek before the first epoch, an evaluation pass over the training loader
each epoch, an unshuffled DistributedSampler iterated every epoch, a shuffling loader without a
DistributedSampler whose batches never reach a collective (a per-rank reference run).

The fixed loops are also run by tests/audits/jobs/runtime/torch_job.py's fixed job (`loops("fixed")`,
imported): one 2-rank job for both fixed forms, where two cost the suite ~13 CPU-s more."""

import sys

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def train_epoch(loader: DataLoader) -> float:
    total = 0.0
    for (batch,) in loader:  # line: helper loop
        total += float(batch.sum())  # stands for the training step
    return total


def loops(mode: str) -> float:
    """The job's loaders and their three epochs, in a process group already made."""
    data = TensorDataset(torch.arange(16.0))
    inline_sampler = DistributedSampler(data, shuffle=True)  # line: built inline
    inline_loader = DataLoader(data, batch_size=4, sampler=inline_sampler)
    helper_sampler = DistributedSampler(data, shuffle=True, seed=1)  # line: built helper
    helper_loader = DataLoader(data, batch_size=4, sampler=helper_sampler)
    if mode == "broken":
        extra_loader = DataLoader(data, batch_size=4, shuffle=True)  # every rank draws from all 16
    else:
        extra_loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data, shuffle=False))
        next(iter(inline_loader))  # a peek at the data before training
        reference_loader = DataLoader(data, batch_size=4, shuffle=True)

    total = 0.0
    for epoch in range(3):
        if mode == "fixed":
            inline_sampler.set_epoch(epoch)
            helper_sampler.set_epoch(epoch)
        for (batch,) in inline_loader:  # line: inline loop
            total += float(batch.sum())
        total += train_epoch(helper_loader)
        for (batch,) in extra_loader:  # line: extra loop
            dist.all_reduce(batch)  # its batches reach the job: what makes an unsharded shuffle matter
            total += float(batch.sum())
        if mode == "fixed":
            total += sum(float(batch.sum()) for (batch,) in inline_loader)  # an evaluation pass
            # a per-rank reference run: the same shuffled data on every rank on purpose, no collective
            total += sum(float(batch.sum()) for (batch,) in reference_loader)
    dist.barrier()
    print(f"rank {dist.get_rank()}: loaders done, total {total}", flush=True)
    return total


if __name__ == "__main__":
    dist.init_process_group(backend="gloo")
    loops(sys.argv[1])
    print(f"rank {dist.get_rank()}: done", flush=True)
    dist.destroy_process_group()
